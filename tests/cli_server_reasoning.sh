#!/usr/bin/env bash
# cli_server_reasoning.sh - `hotmoe serve` with a Harmony (gpt-oss) chat template: the template is
# recognised, replies go through the content/reasoning splitter (hm_chat_reply, unit-tested with
# real Harmony replies in test_tokenizer_chat) and a reply without channels comes back whole as
# content, streamed and not, the same as with reasoning_format "none" (the raw text); a bad
# reasoning_format is a 400 naming it. The tiny fixture model cannot write Harmony channels itself.
set -u
. "$(dirname "$0")/lib.sh"
MODEL=$SRC/tests/fixtures/qwen3moe_tiny/model.gguf
hm_need curl jq
[ -f "$MODEL" ] || { echo "SKIP: $MODEL missing"; exit 77; }
hm_tmpdir reasoning
TMPL='{% for m in messages %}<|start|>{{ m.role }}<|message|>{{ m.content }}<|end|>{% endfor %}<|start|>assistant<|channel|>'
K=reasoning-key
hm_serve "$K" -t 1 -c 512 --api-key "$K" --chat-template "$TMPL"
URL=http://127.0.0.1:$PORT
A=(-H "Authorization: Bearer $K" -H 'Content-Type: application/json')
MSG='"messages":[{"role":"system","content":"Reasoning: low"},{"role":"user","content":"hi"}],"max_tokens":12,"temperature":0,"ignore_eos":true'

check "props: harmony" [ "$(curl -s "${A[@]}" "$URL/props" | jq -r .chat_template_name)" = harmony ]
curl -s "${A[@]}" "$URL/v1/chat/completions" -d "{$MSG}" >"$tmp/split.json"
curl -s "${A[@]}" "$URL/v1/chat/completions" -d "{$MSG,\"reasoning_format\":\"none\"}" >"$tmp/raw.json"
# compared as JSON strings (the random model's text may hold any character)
split=$(jq '.choices[0].message.content' "$tmp/split.json")
raw=$(jq '.choices[0].message.content' "$tmp/raw.json")
check "a reply without channels: all content" [ "$raw" != '""' ] && [ "$raw" != null ] && [ "$split" = "$raw" ]
check "no reasoning_content without an analysis channel" [ "$(jq -r '.choices[0].message | has("reasoning_content")' "$tmp/split.json")" = false ]
curl -sN "${A[@]}" "$URL/v1/chat/completions" -d "{$MSG,\"stream\":true}" >"$tmp/sse"
streamed=$(sed -n 's/^data: //p' "$tmp/sse" | grep -v '^\[DONE\]' | jq -s 'map(.choices[0].delta.content // "") | join("")')
check "streamed content = the reply" [ "$streamed" = "$split" ]
check "first chunk carries the role" [ "$(sed -n 's/^data: //p' "$tmp/sse" | head -1 | jq -r '.choices[0].delta.role')" = assistant ]
status=$(curl -s -o "$tmp/bad.json" -w '%{http_code}' "${A[@]}" "$URL/v1/chat/completions" -d "{$MSG,\"reasoning_format\":\"bogus\"}")
check "bad reasoning_format: 400" [ "$status" = 400 ]
check "bad reasoning_format: named" [ "$(jq -r .error.param "$tmp/bad.json")" = reasoning_format ]
exit $fail
