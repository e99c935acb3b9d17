#!/usr/bin/env python3
"""The demo's caption score: the share of captioned held-out images whose generated caption
names the reference's shape and both its colours.

Usage: python3 scripts/demo/caption_score.py SAMPLES.jsonl [--before BEFORE.jsonl]
(files written by `tessera generate --shards`; BEFORE: the same images captioned before
training, whose score is printed beside)

A synth reference reads "a {large|small} COLOUR SHAPE ... on a BACKGROUND background": the
first object's colour and shape and the background's colour are what a caption must name (as
words, anywhere in it). Prints the score with its count, then each part alone (the background
colour as the caption's last colour word, the object's colour, its shape), so a reader sees
which of them the model has learned; exits 1 when no line of the file is a synth caption.
"""
import json
import sys


def keys(reference):
    words = reference.split()
    if len(words) < 7 or words[0] != "a" or words[-1] != "background":
        return None
    return words[2], words[3], words[-2]


def background(caption):
    words = caption.split()
    return words[-2] if len(words) >= 2 and words[-1] == "background" else None


def score(path):
    """(hits, total, hits per part) of a samples file."""
    hits = total = 0
    parts = {"background": 0, "object colour": 0, "shape": 0}
    with open(path) as f:
        for line in f:
            sample = json.loads(line)
            want = keys(sample["reference"])
            if want is None:
                continue
            colour, shape, bg = want
            said = set(sample["generated"].split())
            total += 1
            hits += {colour, shape, bg} <= said
            parts["background"] += background(sample["generated"]) == bg
            parts["object colour"] += colour in said
            parts["shape"] += shape in said
    if total == 0:
        sys.exit(f"{path}: no synth caption to score")
    return hits, total, parts


def main():
    args = sys.argv[1:]
    if len(args) not in (1, 3) or (len(args) == 3 and args[1] != "--before"):
        sys.exit(__doc__)
    hits, total, parts = score(args[0])
    before = ""
    if len(args) == 3:
        b_hits, b_total, b_parts = score(args[2])
        before = f"; before training {b_hits / b_total:.0%} ({b_hits} of {b_total})"
    # One decimal: 51 of 64 is 79.7%, which a whole percent would print as 80%.
    print(f"caption score: {hits / total:.1%} ({hits} of {total} held-out images name the "
          f"reference's shape and both its colours){before}")
    print("  by part: " + ", ".join(f"{k} {v / total:.0%}" for k, v in parts.items()))
    if len(args) == 3:
        print("  before:  " + ", ".join(f"{k} {v / b_total:.0%}" for k, v in b_parts.items()))


if __name__ == "__main__":
    main()
