// tok_oracle.mjs — reference ids from @huggingface/tokenizers for the tokenizer parity test.
// Usage: node tok_oracle.mjs TOKENIZER.json STRINGS.json  → prints a JSON list of id lists,
// one per input string, encoded without special-token templates (add_special_tokens false).
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const [tokPath, stringsPath] = process.argv.slice(2);
if (!tokPath || !stringsPath) {
  console.error("usage: node tok_oracle.mjs TOKENIZER.json STRINGS.json");
  process.exit(2);
}
const tok = new Tokenizer(JSON.parse(readFileSync(tokPath, "utf8")), {});
const texts = JSON.parse(readFileSync(stringsPath, "utf8"));
const ids = texts.map((t) => tok.encode(t, { add_special_tokens: false }).ids);
process.stdout.write(JSON.stringify(ids) + "\n");
