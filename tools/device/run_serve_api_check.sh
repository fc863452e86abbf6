#!/bin/bash
# Runs on the GPU machine from the repo root: `blockspec serve --device cuda` (stories260K +
# DFlash) answering several prompts with n choices, echo with prompt logprobs, and streaming;
# each greedy choice is compared with `blockspec generate --device cuda`. Logs under $OUT.
set -u
. tools/device/device_env.sh
$B serve --device cuda --port 18080 > $OUT/serve.log 2>&1 &
P=$!
for _ in $(seq 100); do curl -s localhost:18080/health > /dev/null && break; sleep 0.2; done
head -1 $OUT/serve.log
post() { curl -s localhost:18080/v1/completions -H 'Content-Type: application/json' -d "$1"; }
post '{"prompt": ["Once upon a time", "The little dog"], "n": 2, "max_tokens": 40, "temperature": 0}' > $OUT/multi.json
for i in 0 1; do
  p=$([ $i = 0 ] && echo "Once upon a time" || echo "The little dog")
  G=$($B generate --device cuda --prompt "$p" --max-tokens 40 2>/dev/null)
  python3 - "$G" $i $OUT/multi.json <<'PY'
import json, sys
g, i, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = json.load(open(path))["choices"]
for j in (2 * i, 2 * i + 1):
    print(f"choice {j}:", "== generate" if c[j]["text"] == g.rstrip("\n") else f"MISMATCH {c[j]['text']!r} vs {g!r}")
PY
done
post '{"prompt": [1, 403, 407, 261, 378, 432, 383], "echo": true, "logprobs": 2, "max_tokens": 1, "temperature": 0}' |
  python3 -c "import json,sys; c=json.load(sys.stdin)['choices'][0]; print('echo:', repr(c['text']), [None if x is None else round(x, 4) for x in c['logprobs']['token_logprobs']], c['finish_reason'])"
post '{"prompt": "Once upon a time", "n": 3, "max_tokens": 24, "temperature": 0.9, "seed": 5, "stream": true}' |
  python3 -c "
import json, sys
t = {}
for line in sys.stdin:
    if line.startswith('data: ') and '[DONE]' not in line:
        c = json.loads(line[6:])['choices'][0]; t[c['index']] = t.get(c['index'], '') + c['text']
print('streamed n=3 seeded:', {k: v[:40] for k, v in sorted(t.items())})"
kill $P; wait $P 2> /dev/null; tail -2 $OUT/serve.log
