"""CI: the wheel ships what the installed package reads (kernel sources, goldens, spec, xfail lists, the byte
models) and none of the development tree (tools/dev, the retrieval model, tests, docs, benchmarks)."""
import sys
import zipfile

names = zipfile.ZipFile(sys.argv[1]).namelist()
need = ["veloxquant/accelerated/kernels/csrc/", "veloxquant/golden/manifest.toml", "veloxquant/spec/",
        "veloxquant/conformance/xfail/", "veloxquant/tools/quality/trained/byte_llama_hd64.safetensors"]
forbidden = ["veloxquant/tools/dev/", "veloxquant/tools/quality/trained/retrieval_4m/", "tests/", "docs/",
             "benchmarks/", ".device/"]
missing = [n for n in need if not any(x.startswith(n) for x in names)]
bad = sorted({f for f in forbidden for x in names if x.startswith(f)})
size = sum(i.file_size for i in zipfile.ZipFile(sys.argv[1]).infolist())
print(f"wheel contents: {len(names)} files, {size / 2**20:.1f} MiB unpacked")
if missing or bad:
    print(f"wheel contents: missing {missing}; shipped but should not be {bad}")
    sys.exit(1)
