// A tensor-core loop hook (attention_source.py binds VQ_TC_*) with nothing to add: one code stream per role.
