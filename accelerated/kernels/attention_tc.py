"""Steps 3-4 of the attention `partial` kernel on tensor cores (CUDA, sm_80 and later): turboquant keys and values
with 4-bit codes, and the other codes tuning's knobs admit (`takes` below says which pairs; attention.py's
`_tensor_cores` adds the GPU's mma). The setup (step 1-2: queries scaled, rotated into the keys' domain, in `sq`)
and steps 5 and the fused combine are attention_source.py's (csrc/partial.h), unchanged; this loop
(csrc/tc_loop.cuh) leaves `sacc` / `sml` as the scalar loop does.

Tolerance tier (spec/attention.md). Each warp takes 16 tokens at a time with mma.m16n8k16 (float16 operands,
float32 accumulation). float16 alone would round each operand to 11 bits, so every operand is split in two
float16 parts, x = hi + lo with hi the float16 rounding of x and lo that of x - hi (22 bits; the rest is below
2^-22 |x|), and each product is formed from both parts of both sides but lo.lo:
- scores S = Q K^T: the query rows (at most 4) in M, their hi parts in rows 0-3 and lo parts in rows 4-7 (rows
  8-15 zero), each k-step taken twice, with the keys' hi parts and then their lo parts; rows r and r + 4 are
  summed afterwards (lanes g and g ^ 4);
- value sums O^T = V^T P^T, transposed so that no M row is wasted: coordinates in M (two 8-coordinate halves),
  the rows' two parts in N (columns 0-3 hi, 4-7 lo; the scores' accumulator layout is the probabilities'
  operand layout, so P needs no exchange), each m-tile taken with the values' hi and then lo parts.
Before splitting, query rows, code tables and p times the value norm are scaled by powers of two (exact) that put
their largest magnitude near 2^10 and keep the float16 parts normal; the value norms' scale is set by the first
chunk and lowered (O rescaled with it) when a chunk's norms would exceed it. Results are scaled back exactly.

Coordinates are assigned to mma slots so that each lane's codes come from whole words (the dot products
do not depend on the order of coordinates): for the scores, lane quarter tig owns coordinates
tig * D/4 .. tig * D/4 + D/4 - 1 of a token (one 16-byte load at D = 128), k-step ks using 4 ks .. 4 ks + 3 of
them; for the value sums, lane group g owns coordinates g * D/8 .. g * D/8 + D/8 - 1, m-tile mt holding
coordinate g * D/8 + mt in its row g and g * D/8 + D/16 + mt in its row g + 8. A code is looked up with a
shuffle from the lane that holds its table entry (the entry's hi and lo parts packed in one word; lanes 16-31
repeat lanes 0-15, so the shifted word needs no mask: a shuffle reads the low 5 bits of its lane operand), and
two entries' parts are paired for a float16x2 operand with one byte permute.

How a lane finds its codes is the layout's part of the loop (csrc/tc_words_*.cuh: codes of 1, 2 or 4 bits, in whole
words or part of one). With a role of 3-bit codes (tuning's tc_3bit; attention_source.TC_TENS, csrc/tc_tens_*.cuh,
the other role as before) the coordinates stay the same, but 3-bit codes lie 10 to a word (2 zero bits on top,
never straddling: spec/packing.md), so a lane's D/4 key codes (a group's D/8 value codes) start at an even code
offset up to 8 inside a word and span up to (n + 17) / 10 words: those are loaded raw, one word at a time (a row is
4 ceil(D / 10) bytes, not 8- or 16-byte aligned; the loads stop at the row's last word), and realigned where a code
is read: word k of the realigned codes is (raw[k] >> 3 o) | (raw[k + 1] << (30 - 3 o)), code i at bit 3 (i % 10) of
word i / 10, all indices constant after unrolling. Head dims 64 and 128 both, as for the other codes.

mlx_affine records (tuning's tc_affine, csrc/tc_affine_loop.cuh): a scale and bias per token and group of G >= 32
coordinates cannot be folded into the query (one key k-step takes four lane quarters' coordinates, of up to four
groups) nor into the probabilities (one value m-tile takes eight lane groups' coordinates), and separate score tiles per
group scaled per token afterwards would skip the decode's roundings to the records' dtype, which 16-bit records must
keep (spec/attention.md). So each element is dequantized in registers as the scalar loop does, x = T(T(c s) + b),
times a power of two per chunk (keys: the chunk's largest (2^b - 1) |s| + |b| near 2^11; values: fv as above) into the
B (keys) or A (values) operand. A 16-bit x so scaled is exact in float16 (only bits below 2^-24 are lost, which a lo
part could not hold either): one mma per step; float32 records are split in hi and lo parts, two mmas per step.

Ragged KIVI rows (tuning's tc_ragged; accelerated/cache/ragged.py: each batch row's key groups start at its own
phase f): a threadgroup's tokens are one row's, so f is uniform in it; under VQ_RAGGED the KIVI loop's 16-token chunks
start at t0 rounded down to f mod 16 (G a multiple of 16: a chunk lies in one of the row's groups) and a chunk's
group row is (t - f) / G (VQ_KGROW, the scalar loop's); the splits, the window split and the append are the ragged
scalar partial's (csrc/partial_setup_tokens.h).

turboquant_rvq (TWO_STREAMS): a coordinate is (C1[i] + C2[k]) n, so each stream's codes are looked up in their own
table (scaled by the one power of two that covers both) and take their own mma pass into the same score and value
accumulators; the second stream's words follow the first's layout at their own width, loaded beside them.
turboquant_prod keys (TWO_STREAMS, MK = 3): the QJL signs take one mma per k-step against the projected query
(setup's sq2, split and scaled as the query) into scores of their own, added with the token's gamma A_d. prod
values (PROD_VALUES, MV = 3): the signs one mma per m-tile into a second accumulator o2 (the output's
sketch-domain part, which the combine maps back), with P'' = p n gamma A_d scaled as P'.
prod b4 (tuning's tc_prod3): its 3-bit mse codes in the 3-bit layout (attention_source.TC_TENS_PARTS) and its signs in
their own 1-bit one (tc_two_setup.cuh's KWL2 / VWL2 and row bases), the scores' n-tile loop unrolled (PROD3_KEYS,
PROD3_VALUES); with prod in both roles the keys' projected-query fragment is made from shared memory at each k-step
(tc_prod3_signs.cuh), which leaves the registers for the values' second accumulator.

Turboquant keys beside KIVI values (tuning's tc_mixed; attention_source.TC_MIX, csrc/tc_mixed_*.cuh: the recommended
quality configuration, keys turboquant 3-bit with R = 0 and values KIVI 2-bit with R = 128): the keys' score pass as
above in the 3-bit or word layout, the values' m-tiles as KIVI's (s code + z dequantized into A, hi and lo parts), the
chunks from t0 (neither role groups tokens). Their encoded counts differ (attention_source.MIXED_WINDOWS, HASWIN 3:
the values' window only): split S - 1 of that MIXED partial, the rows the append encodes and the values' window rows
beside the keys' records, takes no mma chunk but runs in scalar arithmetic in the same kernel, with the window split
(csrc/tc_mixed_split.h: a few hundred tokens at most, some exact; each window from its own rows); the encoded splits,
the common prefix, run on the tensor cores. With a keys' window too (HASWIN 4) an exact key there is dotted with the
query as given (a rotation keeps dot products; the scalar loop rotates the key instead). Ragged rows of that pair
(tuning's tc_ragged with tc_mixed; cache/ragged.py: the values' groups from each row's phase) take the same loop under
VQ_RAGGED: neither role groups tokens, so the chunks need no phase shift; each row's ranges are the ragged scalar MIXED
partial's (csrc/partial_setup_mixed_ragged.h) and split S - 1 reads a value exact past its row's own boundary QVR.

KIVI keys beside turboquant or rabitq values (tuning's tc_mixkv, off until its GPU twins pass; attention_source.
TC_MIXK, csrc/tc_mixkv_*.cuh: docs/quality-retrieval.md's pick at the 5-bit budget, keys KIVI 4-bit with R = 128, values
turboquant 4-bit): the keys' score pass as KIVI's (the query times the key group's scales, the codes exact, zq; a
warp's chunks by tc_kpairs), the values' m-tiles as turboquant's (the 3-bit or word layout, P' = p times the token's
norm, rabitq's factor). KIVI keys encode whole groups, so their count trails the values' (HASWIN 2: the keys' window
only; 4: both): split S - 1 runs in scalar arithmetic as TC_MIX's (tc_mixed_split.h with this pair's token,
tc_mixkv_token.h), an exact value there rotated into the values' domain across the lanes (tc_mixkv_rotate.h). Ragged
rows of this pair (VQ_RKEYS) keep the scalar loop.

Launch shape (attention.py, accelerated.tuning's tc_* knobs): 2 threadgroups of 4 warps per multiprocessor (launch
bounds), the next tc_prefetch chunks' loads in flight in registers, and as many splits as fill the GPU once
(docs/decode-step-analysis.md, "Fifth pass").
"""
from __future__ import annotations

from . import loader
from .methods import _code_bits

TC_CUDA_HEADER = loader.text("tc_header.cuh")     # the helpers: float16 pairs, mma.m16n8k16, power-of-two scales
# the loop's hooks (computed includes) for a second code stream per role: turboquant_rvq's codes2 in the residual
# table, each stream its own mma pass into the same accumulators, or turboquant_prod's QJL signs (keys: scores of
# their own; values: a second accumulator) (csrc/tc_two_*.cuh); nothing with one stream
_HOOKS = ("VQ_TC_MAX2", "VQ_TC_TAKE2", "VQ_TC_SCORES2", "VQ_TC_SIGNS", "VQ_TC_XA2", "VQ_TC_SOFTMAX2",
          "VQ_TC_VALUES2")
ONE_STREAM = {"VQ_TC_STAGE2": "tc_stage1.cuh", "VQ_TC_MERGE": "tc_loop_merge.cuh", "VQ_TC_UNROLL_NT": "tc_none.cuh",
              **dict.fromkeys(_HOOKS, "tc_none.cuh")}
TWO_STREAMS = {"VQ_TC_STAGE2": "tc_two_setup.cuh", "VQ_TC_MERGE": "tc_loop_merge.cuh",     # (names spelled out: the
               "VQ_TC_MAX2": "tc_two_max.cuh", "VQ_TC_TAKE2": "tc_two_take.cuh",        # dead-source test looks
               "VQ_TC_SCORES2": "tc_two_scores.cuh", "VQ_TC_XA2": "tc_two_xa.cuh",      # for them)
               "VQ_TC_SOFTMAX2": "tc_two_softmax.cuh", "VQ_TC_VALUES2": "tc_two_values.cuh",
               "VQ_TC_SIGNS": "tc_two_qb2.cuh", "VQ_TC_UNROLL_NT": "tc_none.cuh"}
assert set(TWO_STREAMS) == set(ONE_STREAM)
# ... with prod values: two value parts a row merged (the one-part merge kept for the others: its registers)
PROD_VALUES = {**TWO_STREAMS, "VQ_TC_MERGE": "tc_two_merge.cuh"}
# ... prod keys beside a 3-bit role (tc_prod3): the scores' n-tile loop unrolled (csrc/tc_prod3_unroll.cuh)
PROD3_KEYS = {**TWO_STREAMS, "VQ_TC_UNROLL_NT": "tc_prod3_unroll.cuh"}
# ... prod values with 3-bit codes (tc_prod3): the same unroll; prod keys' signs alone (no rvq keys beside them)
# against a query fragment made from shared memory at each k-step (csrc/tc_prod3_signs.cuh: the register copy
# spilled beside the second accumulator)
PROD3_VALUES = {**PROD_VALUES, "VQ_TC_UNROLL_NT": "tc_prod3_unroll.cuh", "VQ_TC_SCORES2": "tc_two_signs.cuh",
                "VQ_TC_SIGNS": "tc_prod3_signs.cuh"}


def mixed_pair(kp, vp) -> bool:
    """Whether a pair of roles' params (spec.Params) is the one TC_MIX's loop is for: turboquant keys, KIVI values."""
    return kp.method == "turboquant" and vp.method == "kivi"


def mixed_takes(kp, vp, d: int, has_win, codes: bool, three: bool) -> bool:
    """Whether TC_MIX's loop (csrc/tc_mixed_loop.cuh) takes a mixed_pair: head dim 64 or 128; keys of 4 bits, 3 with
    tuning's tc_3bit, 1 or 2 with tc_codes (a lane's D / 4 codes at least one word); KIVI values of 1, 2 or 4 bits; no
    window, both roles' of one length, or a MIXED partial (HASWIN 3: the values' window only; 4: both roles', apart)."""
    kb = kp.bits
    if not mixed_pair(kp, vp):
        return False
    keys = kb == 4 or (kb == 3 and three) or (kb in (1, 2) and codes and kb * d >= 128)
    return d in (64, 128) and keys and vp.bits in (1, 2, 4) and int(has_win) in (0, 1, 3, 4)


def mixkv_pair(kp, vp) -> bool:
    """Whether a pair of roles' params is one TC_MIXK's loop is for: KIVI keys, turboquant or rabitq values (one code
    stream and a factor per token: tc_loop.cuh's value side)."""
    return kp.method == "kivi" and vp.method in ("turboquant", "rabitq")


def mixkv_takes(kp, vp, d: int, has_win, codes: bool, three: bool) -> bool:
    """Whether TC_MIXK's loop (csrc/tc_mixkv_loop.cuh) takes a mixkv_pair: head dim 64 or 128; KIVI keys of 1, 2 or 4
    bits (a lane's D / 4 codes at least one word); turboquant values of 4 bits, 3 with tuning's tc_3bit, 1 or 2 with
    tc_codes, rabitq values with tc_codes; no window, both roles' of one length, or a MIXED partial (HASWIN 2: the
    keys' window only; 4: both)."""
    kb, vb = kp.bits, _code_bits(vp)[0]
    if not mixkv_pair(kp, vp):
        return False
    values = vb == 4 or (vb == 3 and three) or (vb in (1, 2) and codes)
    return d in (64, 128) and kb in (1, 2, 4) and kb * d >= 128 and values and int(has_win) in (0, 1, 2, 4)


def takes(kp, vp, d: int, has_win, mixed_launch: bool, codes: bool = False, kivi: bool = False, affine: bool = False,
          three: bool = False, two: bool = False, prod3: bool = False, mixed: bool = False,
          mixkv: bool = False) -> bool:
    """Whether a loop of this module holds a pair of roles (spec.Params; `mixed_launch`: a MIXED partial, the roles'
    encoded counts apart): turboquant keys and values with 4-bit codes, head dim 64 or 128; with `codes` (tuning's
    tc_codes) also rabitq and 1- or 2-bit turboquant codes in either role (a lane's D / 4 key codes at least one word);
    with `three` (tuning's tc_3bit) also 3-bit turboquant codes in either role, beside any of those in the other
    (csrc/tc_tens_*.cuh); with `two` (tuning's tc_two_stage) turboquant_rvq in either role, both streams 1-, 2- or 4-bit
    (each its own mma pass: csrc/tc_two_*.cuh), and turboquant_prod with 1-, 2- or 4-bit mse codes (bits 2, 3, 5; their
    QJL signs a pass of their own; keys at d = 128), beside any one-stream role but a 3-bit one; with `prod3` too
    (tuning's tc_prod3) turboquant_prod beside a 3-bit role or with 3-bit mse codes itself (bits 4: the 3-bit layout and
    the signs' stream in its own layout, attention_source.PARTIAL_TC3_TWO_BODY / PARTIAL_TC3_PROD_VALUES_BODY), rvq with
    a 3-bit stream still not; with `kivi` (tuning's tc_kivi) KIVI keys and values, both roles, 1-, 2- or 4-bit codes
    (tc_kivi_loop.cuh; a lane's D / 4 key codes at least one word); with `affine` (tuning's tc_affine) mlx_affine keys
    and values, both roles, 2-, 4- or 8-bit codes (tc_affine_loop.cuh); with `mixed` (tuning's tc_mixed) turboquant keys
    beside KIVI values (mixed_takes), also as a MIXED partial (HASWIN 3, 4; other MIXED pairs: the scalar loop). The
    window split runs its exact tokens in scalar arithmetic (csrc/tc_window.h, tc_mixed_split.h); with `mixkv` (tuning's
    tc_mixkv) KIVI keys beside turboquant values (mixkv_takes), also as a MIXED partial (HASWIN 2, 4)."""
    if mixkv_pair(kp, vp):
        return mixkv and mixkv_takes(kp, vp, d, has_win, codes, three)
    if mixed_pair(kp, vp) or mixed_launch:
        return mixed and mixed_takes(kp, vp, d, has_win, codes, three)
    if kp.method == "mlx_affine" or vp.method == "mlx_affine":
        return (affine and kp.method == vp.method == "mlx_affine" and d in (64, 128) and kp.bits in (2, 4, 8)
                and vp.bits in (2, 4, 8))
    staged = {"turboquant_rvq", "turboquant_prod"}
    if {kp.method, vp.method} & staged and 3 in (_code_bits(kp)[0], _code_bits(vp)[0]) and \
            not (prod3 and two and "turboquant_rvq" not in (kp.method, vp.method)):
        return False
    if kp.method == "kivi" or vp.method == "kivi":
        return (kivi and kp.method == vp.method == "kivi" and d in (64, 128) and kp.bits in (1, 2, 4)
                and vp.bits in (1, 2, 4) and kp.bits * d >= 128)
    def role(p, keys: bool) -> bool:
        if p.method == "turboquant" and p.bits == 4:
            return True
        if p.method == "turboquant" and p.bits == 3:
            return three
        if p.method in ("turboquant_rvq", "turboquant_prod"):
            ok = (1, 2, 3, 4) if prod3 and p.method == "turboquant_prod" else (1, 2, 4)
            return two and all(b in ok and (not keys or b * d >= 128) for b in _code_bits(p))
        b = _code_bits(p)[0]
        return codes and p.method in ("turboquant", "rabitq") and b in (1, 2, 4) and (not keys or b * d >= 128)
    return d in (64, 128) and role(kp, True) and role(vp, False)
