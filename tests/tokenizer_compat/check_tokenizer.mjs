#!/usr/bin/env node
// Checks a tokenizer folder written by moeserve against Hugging Face's own tokenizer code.
//
//   node check_tokenizer.mjs MODEL_DIR [TEXT...]
//
// MODEL_DIR holds tokenizer.json (and, optionally, tokenizer_config.json). The TEXTs (a built-in
// set when none are given) are encoded with add_special_tokens = false and decoded with
// skip_special_tokens = false by `tokenizers` (Hugging Face's Rust library through its official
// Node bindings, the code behind transformers' PreTrainedTokenizerFast), then:
//   - decode(encode(text)) must give NFC(text) back (the tokenizer normalizes to NFC, so for ASCII
//     this is the text itself), and plain text must never produce an added-token id;
//   - "<|im_start|>user\nhi<|im_end|>" must encode to the special ids around ordinary tokens;
//   - tokenizer_config.json, when present, must name specials that tokenizer.json defines with
//     the same ids.
// Prints one line per check and exits with status 1 if any fails.
//
// `tokenizers` is resolved from this script's folder, so run it from a folder where
// `npm install` (package.json next to this script) has been done; run.sh does that.
import fs from 'node:fs';
import path from 'node:path';
import { Tokenizer } from 'tokenizers';

const DEFAULT_TEXTS = [
  'Hello world',
  'The quick brown fox jumps over the lazy dog.',
  "It's 12:30, and we'll leave at 5 p.m. -- don't be late!",
  'Tabs\tand  double  spaces,   triple spaces\nnew lines\r\nand a trailing space ',
  '  leading spaces, (brackets) [1, 2, 3] {"json": true} <tag/> a+b=c; x_y @ #hash $5 100%',
  'numbers 0123456789 and 3.14159',
  '',
  'caf\u00e9 na\u00efve \u4e2d\u6587 \u{1F600} e\u0301',  // non-ASCII; e + U+0301 is NFC-composed
];

const SPECIAL_TEXT = '<|im_start|>user\nhi<|im_end|>';

let failures = 0;
function report(ok, what, detail = '') {
  if (!ok) failures += 1;
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${what}${detail ? `: ${detail}` : ''}`);
}

async function encode(tokenizer, text) {
  const encoding = await tokenizer.encode(text, null, { addSpecialTokens: false });
  return encoding.getIds();
}

async function main() {
  const [dir, ...args] = process.argv.slice(2);
  if (!dir) {
    console.error('usage: node check_tokenizer.mjs MODEL_DIR [TEXT...]');
    process.exit(2);
  }
  const texts = args.length > 0 ? args : DEFAULT_TEXTS;

  const tokenizer = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
  const json = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
  const baseVocab = tokenizer.getVocabSize(false);
  const merges = json.model.merges.length;
  report(baseVocab === Object.keys(json.model.vocab).length, 'load tokenizer.json',
         `${baseVocab} BPE tokens, ${merges} merges, ` +
         `${tokenizer.getVocabSize(true) - baseVocab} added tokens`);

  for (const text of texts) {
    const ids = await encode(tokenizer, text);
    const decoded = await tokenizer.decode(ids, false);
    const expected = text.normalize('NFC');
    const label = JSON.stringify(text.length > 40 ? `${text.slice(0, 40)}...` : text);
    const bytes = Buffer.byteLength(text, 'utf8');
    report(decoded === expected, `round trip ${label}`,
           decoded === expected ? `${bytes} bytes -> ${ids.length} tokens`
                                : `decoded ${JSON.stringify(decoded)}`);
    const added = ids.filter((id) => id >= baseVocab);
    report(added.length === 0, `no added tokens in ${label}`,
           added.length === 0 ? '' : `ids ${added.join(',')}`);
  }

  const imStart = tokenizer.tokenToId('<|im_start|>');
  const imEnd = tokenizer.tokenToId('<|im_end|>');
  report(imStart != null && imEnd != null, 'special tokens defined',
         `<|im_start|>=${imStart} <|im_end|>=${imEnd}`);
  const ids = await encode(tokenizer, SPECIAL_TEXT);
  const inner = ids.slice(1, -1);
  report(ids.length >= 3 && ids[0] === imStart && ids[ids.length - 1] === imEnd &&
             inner.every((id) => id < baseVocab),
         `special tokens in ${JSON.stringify(SPECIAL_TEXT)}`, `ids [${ids.join(', ')}]`);
  const decoded = await tokenizer.decode(ids, false);
  report(decoded === SPECIAL_TEXT, 'decode keeping special tokens', JSON.stringify(decoded));
  const skipped = await tokenizer.decode(ids, true);
  report(skipped === 'user\nhi', 'decode skipping special tokens', JSON.stringify(skipped));

  const configFile = path.join(dir, 'tokenizer_config.json');
  if (fs.existsSync(configFile)) {
    const config = JSON.parse(fs.readFileSync(configFile, 'utf8'));
    for (const [id, token] of Object.entries(config.added_tokens_decoder ?? {})) {
      const actual = tokenizer.tokenToId(token.content);
      report(actual === Number(id), `tokenizer_config.json added token ${token.content}`,
             `id ${id}, tokenizer.json says ${actual}`);
    }
    for (const key of ['eos_token', 'pad_token']) {
      const id = config[key] == null ? null : tokenizer.tokenToId(config[key]);
      report(id != null && id >= baseVocab, `tokenizer_config.json ${key}`,
             `${config[key]} = ${id}`);
    }
    report(typeof config.chat_template === 'string', 'tokenizer_config.json chat_template');
  }

  console.log(failures === 0 ? 'PASS' : `FAILED: ${failures} check(s)`);
  process.exit(failures === 0 ? 0 : 1);
}

main().catch((error) => {
  console.error(`FAIL ${error.stack ?? error}`);
  process.exit(1);
});
