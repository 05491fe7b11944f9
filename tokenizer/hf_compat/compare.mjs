#!/usr/bin/env node
// Encodes random texts with Hugging Face's tokenizers and with moeserve (through DRIVER, which
// prints {"ids", "decoded", "skip"} per text) and compares ids, decode and decode with
// skip_special_tokens, with and without add_special_tokens.
//
//   node compare.mjs DRIVER WORK_DIR TESTDATA_DIR
//
// Tokenizers: the real Qwen3 one, and variants of testdata/tiny-qwen3next's small one that use
// what Qwen3 does not: added tokens with lstrip / rstrip / single_word / normalized, the GPT-2
// ByteLevel split with add_prefix_space, NFKC / NFKD, Split behaviors, ignore_merges, missing byte
// tokens with and without unk_token, a TemplateProcessing post-processor, added token ids that
// Hugging Face reassigns. Texts mix ASCII, whitespace of every kind, combining marks, jamo, CJK,
// emoji, special-token fragments and the variants' added tokens. Prints one line per tokenizer;
// exits 1 on any difference.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { Tokenizer } from 'tokenizers';

const [driver, work, testdata] = process.argv.slice(2);
const TEXTS = 2000;

// mulberry32: a small seeded generator, so every run checks the same texts.
function rng(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const POOL = [...'abcqzXYZ   \t\n\r0123456789\'.,!?-_(){}<>|/\\"',
  '\u0085', '\u00a0', '\u2000', '\u3000', '\u200b', '\u200d', '\ufeff', '\u2028', '\u0301',
  '\u0308', '\u0323', '\u1100', '\u1161', '\u11a8', '\uac00', 'é', 'e\u0301', 'Å', '\u212b',
  '\u2126', 'ﬁ', '中', '文', '，', '。', 'こ', 'カ', '\u3099', '한', 'ק', 'ب', '\u064e', 'क',
  '\u094d', 'ส', '\u0e31', '😀', '👍', '🏽', '\u{1F468}', '\u2764', '\ufe0f', '\u{1F1FA}', '\u0000',
  '\u0001', '\u007f', "'s", "'S", "'ll", "'LL", "'ſ", "'\u212a", '<|im_start|>', '<|im_end|>',
  '<|endoftext|>', '<think>', '</think>', '<tool_call>', '<|im_', '|>', '  \n', '\n\n', '\r\n',
  '   ', 'ß', 'İ', 'ǅ', '²', '½', 'Ⅻ', '٣', '𝟘', '\u{20000}', '\u{e0001}', '\ufffd', '\uffff',
  '\u{10ffff}', '\u0b47', '\u0b3e', '\uf900', '<mask>', 'ony', 'Cafe\u0301', 'Café', ' sp', 'end>',
  '<m', 'abc', 'ABC', 'thequick', ' the quick', '<s>'];

function texts(seed) {
  const next = rng(seed);
  const out = [];
  for (let i = 0; i < TEXTS; ++i) {
    let text = '';
    const n = Math.floor(next() * 30);
    for (let k = 0; k < n; ++k) text += POOL[Math.floor(next() * POOL.length)];
    out.push(text);
  }
  return out;
}

function variants() {
  const base = JSON.parse(fs.readFileSync(`${testdata}/tiny-qwen3next/tokenizer.json`, 'utf8'));
  const copy = () => structuredClone(base);
  const added = (id, content, flags = {}) => ({ id, content, single_word: false, lstrip: false,
    rstrip: false, normalized: false, special: false, ...flags });
  const byteLevel = (addPrefixSpace, useRegex) => ({ type: 'ByteLevel',
    add_prefix_space: addPrefixSpace, trim_offsets: false, use_regex: useRegex });
  const withoutBytes = (v, bytes) => {
    for (const b of bytes) delete v.model.vocab[b];
    v.model.merges = v.model.merges.filter((m) => ![...bytes].some((b) => m.includes(b)));
    return v;
  };
  const v = {};
  v.added = copy();
  v.added.added_tokens.push(
      added(512, '<mask>', { lstrip: true, rstrip: true, single_word: true }),
      added(513, 'ony', { single_word: true, normalized: true }),
      added(514, 'Cafe\u0301', { normalized: true }),
      added(515, ' sp', { lstrip: true }),
      added(516, 'end>', { rstrip: true, special: true }),
      added(517, '<m'),
      added(518, 'abc', { normalized: true, rstrip: true, special: true }));
  v.gpt2 = copy();
  v.gpt2.normalizer = null;
  v.gpt2.pre_tokenizer = byteLevel(true, true);
  v.gpt2_added = structuredClone(v.added);
  v.gpt2_added.pre_tokenizer = byteLevel(true, true);
  v.nfkc = copy();
  v.nfkc.normalizer = { type: 'Sequence', normalizers: [{ type: 'NFKC' }] };
  v.nfkd_added = structuredClone(v.added);
  v.nfkd_added.normalizer = { type: 'NFKD' };
  v.removed = copy();
  v.removed.pre_tokenizer.pretokenizers[0].behavior = 'Removed';
  v.removed_inverted = structuredClone(v.removed);
  v.removed_inverted.pre_tokenizer.pretokenizers[0].invert = true;
  v.two_splits = copy();
  v.two_splits.pre_tokenizer.pretokenizers.unshift(
      { type: 'Split', pattern: { String: 'a' }, behavior: 'Isolated', invert: false });
  v.prefix_after_split = copy();
  v.prefix_after_split.pre_tokenizer.pretokenizers[1] = byteLevel(true, false);
  v.ignore_merges = copy();
  v.ignore_merges.model.ignore_merges = true;
  v.ignore_merges.model.vocab['Ġthequick'] = 600;  // also a gap: HF reassigns the added ids
  v.missing_bytes = withoutBytes(copy(), 'qz');
  v.unk = withoutBytes(copy(), 'qz');
  v.unk.model.vocab['<unk>'] = 509;
  v.unk.model.unk_token = '<unk>';
  for (const t of v.unk.added_tokens) t.id += 1;
  v.unk_fused = structuredClone(v.unk);
  v.unk_fused.model.fuse_unk = true;
  v.template = copy();
  v.template.added_tokens.push(added(512, '<s>', { special: true }));
  v.template.post_processor = { type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: '<s>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
             { SpecialToken: { id: '<|im_end|>', type_id: 0 } }],
    pair: [],
    special_tokens: { '<s>': { id: '<s>', ids: [512], tokens: ['<s>'] },
                      '<|im_end|>': { id: '<|im_end|>', ids: [511], tokens: ['<|im_end|>'] } } };
  return v;
}

async function hfResults(dir, list, addSpecial) {
  const tok = Tokenizer.fromFile(`${dir}/tokenizer.json`);
  const out = [];
  for (const text of list) {
    const enc = await tok.encode(text, null, { addSpecialTokens: addSpecial });
    const ids = Array.from(enc.getIds());
    out.push({ ids, decoded: await tok.decode(ids, false), skip: await tok.decode(ids, true) });
  }
  return out;
}

function ourResults(dir, textsFile, addSpecial) {
  const stdout = execFileSync(driver, [dir, textsFile, addSpecial ? '1' : '0'],
                              { maxBuffer: 1 << 30, encoding: 'utf8' });
  return stdout.split('\n').filter((l) => l.length > 0).map((l) => JSON.parse(l));
}

const dirs = { qwen3: `${testdata}/qwen3-tokenizer` };
for (const [name, json] of Object.entries(variants())) {
  dirs[name] = path.join(work, name);
  fs.mkdirSync(dirs[name], { recursive: true });
  fs.writeFileSync(`${dirs[name]}/tokenizer.json`, JSON.stringify(json));
}

let failed = false;
let seed = 1;
for (const [name, dir] of Object.entries(dirs)) {
  const list = texts(seed++);
  const textsFile = path.join(work, `${name}.texts.jsonl`);
  fs.writeFileSync(textsFile, list.map((text) => JSON.stringify({ text })).join('\n') + '\n');
  for (const addSpecial of [false, true]) {
    const theirs = await hfResults(dir, list, addSpecial);
    const ours = ourResults(dir, textsFile, addSpecial);
    let differences = 0;
    for (let i = 0; i < list.length; ++i) {
      if (JSON.stringify(theirs[i]) === JSON.stringify(ours[i])) continue;
      if (++differences <= 3) {
        console.log(`  text   ${JSON.stringify(list[i])}\n  HF     ${JSON.stringify(theirs[i])}\n` +
                    `  ours   ${JSON.stringify(ours[i])}`);
      }
    }
    const what = `${name}${addSpecial ? ' (add_special_tokens)' : ''}`;
    if (differences > 0 || ours.length !== list.length) {
      failed = true;
      console.log(`FAIL ${what}: ${differences} of ${list.length} texts differ`);
    } else {
      console.log(`ok   ${what}: ${list.length} texts agree`);
    }
  }
}
process.exit(failed ? 1 : 0);
