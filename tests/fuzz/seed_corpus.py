#!/usr/bin/python3
"""Writes a libFuzzer seed corpus from the golden vectors: one file per vector, its first
byte the message type (or 0x80 + topic index for events, as decode_fuzz.cpp reads it).
Usage: /usr/bin/python3 tests/fuzz/seed_corpus.py OUT_DIR"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VECTORS = os.path.join(HERE, "..", "..", "protocol", "vectors")
TOPICS = ["worker.joined", "worker.lost", "coordinator.left", "broker.heartbeat", "broker.stopping"]

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for name in ("valid.json", "invalid.json", "events.json"):
    for v in json.load(open(os.path.join(VECTORS, name)))["vectors"]:
        body = bytes.fromhex(v["body_hex"])
        if "topic" in v:
            lead = 0x80 + (TOPICS.index(v["topic"]) if v["topic"] in TOPICS else 5)
        else:
            lead = bytes.fromhex(v["header_hex"])[3]
        with open(os.path.join(out, v["name"]), "wb") as f:
            f.write(bytes([lead]) + body)
