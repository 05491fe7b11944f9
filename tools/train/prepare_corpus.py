#!/usr/bin/python3
"""Writes the training corpus from Debian-packaged public-domain texts.

  kjv     King James Bible (apt: bible-kjv, which pulls bible-kjv-text), dumped with `bible`;
          one document per chapter: "Genesis 1" then one verse per line, verse numbers dropped.
  austen  Jane Austen's six novels (apt: r-cran-janeaustenr, read with Rscript); one document per
          chapter, paragraphs re-joined from the wrapped lines, one paragraph per line.

Output (in --out):
  corpus.txt     the documents separated by blank lines: the tokenizer's training text
  corpus.jsonl   {"text": document} per line: input of `moeserve tokenize --texts-file`

--chat-fraction of the documents (every n-th) are written to corpus.jsonl as a ChatML exchange
instead, as the chat template renders it: the user gives the document's first two lines (heading
and first verse or paragraph), the assistant continues with the next eight, then <|im_end|>; the
rest of the document follows as a plain document. So `moeserve chat` continues a passage.

Usage: prepare_corpus.py --source kjv|austen|kjv+austen --out DIR [--max-bytes N]
                         [--chat-fraction 0.1]
"""
import argparse
import json
import os
import re
import subprocess
import sys


# kChatMlTemplate (tokenizer/tokenizer_files.cc) rendered for one user and one assistant turn.
CHAT = "<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n{reply}<|im_end|>\n"


def kjv_documents():
    try:
        raw = subprocess.run(["bible", "-l100000", "Gen1:1-Rev22:21"], check=True,
                             capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"prepare_corpus: cannot run `bible` ({e}); apt-get install bible-kjv")
    docs, title, verses = [], None, []
    for line in raw.splitlines():
        m = re.match(r"^\s+\d+ (.*)$", line)
        if m:
            verses.append(m.group(1).strip())
        elif line.strip():
            if title and verses:
                docs.append(title + "\n" + "\n".join(verses))
            title, verses = line.strip(), []
    if title and verses:
        docs.append(title + "\n" + "\n".join(verses))
    return docs


def austen_documents():
    script = ('library(janeaustenr); b <- austen_books(); '
              'writeLines(paste(as.character(b$book), b$text, sep="\\t"))')
    try:
        raw = subprocess.run(["Rscript", "-e", script], check=True, capture_output=True,
                             text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"prepare_corpus: cannot read janeaustenr ({e}); "
                 "apt-get install r-cran-janeaustenr")
    docs, paragraphs, lines, book = [], [], [], None

    def end_paragraph():
        if lines:
            paragraphs.append(re.sub(r"\s+", " ", " ".join(lines)).strip())
            lines.clear()

    def end_document():
        end_paragraph()
        if len(paragraphs) > 1:  # a heading alone (title pages) is dropped
            docs.append("\n".join(paragraphs))
        paragraphs.clear()

    for row in raw.splitlines():
        this_book, _, text = row.partition("\t")
        if this_book != book:
            end_document()
            book = this_book
        text = text.strip()
        if re.match(r"^(CHAPTER|Chapter) [0-9IVXLC]+\.?$", text):
            end_document()
            paragraphs.append(f"{book}, {text.title()}")
        elif not text:
            end_paragraph()
        else:
            lines.append(text)
    end_document()
    # Gutenberg's _underscores_ mark italics; drop them.
    return [d.replace("_", "") for d in docs]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", default="kjv", help="kjv | austen | kjv+austen")
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-bytes", type=int, default=0, help="keep only the first N bytes (tests)")
    ap.add_argument("--chat-fraction", type=float, default=0.1,
                    help="documents written as a ChatML exchange (0: none)")
    a = ap.parse_args()
    docs = []
    for source in a.source.split("+"):
        if source == "kjv":
            docs += kjv_documents()
        elif source == "austen":
            docs += austen_documents()
        else:
            sys.exit(f"prepare_corpus: unknown --source {source}")
    if a.max_bytes:
        kept, size = [], 0
        for d in docs:
            if size >= a.max_bytes:
                break
            kept.append(d)
            size += len(d.encode()) + 2
        docs = kept
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write("\n\n".join(docs) + "\n")
    every = round(1 / a.chat_fraction) if a.chat_fraction > 0 else 0
    chats = 0
    with open(os.path.join(a.out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            lines = d.split("\n")
            texts = [d]
            if every and i % every == every // 2 and len(lines) > 3:
                user, reply, rest = lines[:2], lines[2:10], lines[10:]
                texts = [CHAT.format(user="\n".join(user), reply="\n".join(reply))]
                if rest:
                    texts.append("\n".join(rest))
                chats += 1
            for t in texts:
                f.write(json.dumps({"text": t}, ensure_ascii=False) + "\n")
    total = sum(len(d.encode()) for d in docs)
    print(f"prepare_corpus: {a.source}: {len(docs)} documents ({chats} as chats), "
          f"{total / 1e6:.2f} MB -> {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
