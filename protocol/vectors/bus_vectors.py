"""The topic bus's golden vectors (SPEC §17), for generate.py: valid SUBSCRIBE, UNSUBSCRIBE,
SUBSCRIBED, PUBLISH, PUBLISH_CREDIT, DELIVER, BUS_ACK and BUS_GAP, invalid ones breaking each
field rule, and the bus.* events.

PUBLISH and DELIVER travel as three frames, [header][body][payload] (SPEC §17.1.1): their
vectors give the payload frame's bytes in "payload_hex" (lower-case hex, "" for an empty
payload). The payload is raw bytes, not msgpack, and has no "fields".
"""

TYPES = {"SUBSCRIBE": 0x70, "UNSUBSCRIBE": 0x71, "SUBSCRIBED": 0x72, "PUBLISH": 0x73,
         "PUBLISH_CREDIT": 0x74, "DELIVER": 0x75, "BUS_ACK": 0x76, "BUS_GAP": 0x77}
PAYLOAD_FRAME = ("PUBLISH", "DELIVER")

# Who sends an invalid bus vector to a live broker (SPEC §5.6.1): a node's idle session, for
# the messages a node sends and for those only the broker sends (decoded before refused).
SENDER = "bus"

U64_MAX = 2 ** 64 - 1
# A LIDAR scan's first bytes: float32 ranges, little-endian, every byte value class.
SCAN = bytes([0x00, 0x00, 0x80, 0x3F, 0xCD, 0xCC, 0x4C, 0x40, 0xFF, 0xFF, 0x7F, 0x7F]) + bytes(
    (i * 53 + 7) & 0xFF for i in range(20))
CONFIG = b'{"max_speed": 1.5, "mode": "patrol"}'
FRAME_0 = bytes(range(0, 256, 5))
# A batch of three readings (SPEC §17.5.1): each item a 4-byte big-endian length, then its bytes
# (the second one empty).
BATCH = b"".join(len(x).to_bytes(4, "big") + x for x in (b"\x01\x02", b"", b"temp=21.5"))
FRAME_1 = bytes(range(255, 0, -7))
EVERY_CHAR = "".join(chr(c) for c in range(0x21, 0x7F))  # every character a topic may hold


def build(valid, invalid_body, event, envelope, pack):
    """The bus's (valid, invalid, events) vectors, made with generate.py's helpers: valid(name,
    type, fields, note), invalid_body(name, type, body_hex, code, note, sender),
    event(name, topic, fields, note), envelope(seq) and pack(fields) -> hex."""

    def ok(name, type_name, fields, note, payload=None):
        v = valid(name, type_name, fields, note)
        if type_name in PAYLOAD_FRAME:
            v["payload_hex"] = (payload or b"").hex()
        return v

    def bad(name, type_name, fields, note, code=402, body_hex=None, sender=SENDER):
        v = invalid_body(name, type_name, pack(fields) if body_hex is None else body_hex, code,
                         note, sender)
        if type_name in PAYLOAD_FRAME:
            v["payload_hex"] = SCAN[:4].hex()
        return v

    valid_vectors = [
        ok("subscribe_exact", "SUBSCRIBE", {"req": 1, "topic": "sensors.lidar"},
           "an exact subscription: prefix, echo and last left out (false)"),
        ok("subscribe_prefix_echo_last", "SUBSCRIBE",
           {"req": 2, "topic": "sensors.", "prefix": True, "echo": True, "last": True},
           "every topic that begins with sensors., the node's own publications too, and the "
           "retained values it matches"),
        ok("subscribe_everything", "SUBSCRIBE", {"req": 3, "topic": "", "prefix": True},
           "the empty prefix: every topic"),
        ok("subscribe_longest_topic", "SUBSCRIBE",
           {"req": U64_MAX, "topic": (EVERY_CHAR * 3)[:256]},
           "a topic of 256 bytes holding every character 0x21-0x7E, and the highest req"),
        ok("unsubscribe_exact", "UNSUBSCRIBE", {"req": 4, "topic": "sensors.lidar"},
           "drop the exact subscription of sensors.lidar"),
        ok("unsubscribe_everything", "UNSUBSCRIBE", {"req": 5, "topic": "", "prefix": True},
           "drop the empty prefix subscription"),
        ok("subscribed_accepted", "SUBSCRIBED",
           {"req": 2, "accepted": True, "code": 0, "reason": "", "subscriptions": 2},
           "the SUBSCRIBE took effect: the node holds two subscriptions"),
        ok("subscribed_too_many", "SUBSCRIBED",
           {"req": 9, "accepted": False, "code": 440,
            "reason": "the node holds its maximum of 1024 subscriptions", "subscriptions": 1024},
           "refused: past bus-max-subscriptions (440 TOO_MANY_SUBSCRIPTIONS)"),
        ok("publish", "PUBLISH", {"seq": 1, "topic": "sensors.lidar"},
           "the session's first publication, in one fragment; the payload frame is the scan",
           SCAN),
        ok("publish_retain", "PUBLISH", {"seq": 2, "topic": "config/robot-7", "retain": True},
           "kept as the topic's last value for late subscribers", CONFIG),
        ok("publish_retain_clear", "PUBLISH", {"seq": 3, "topic": "config/robot-7", "retain": True},
           "an empty payload clears the topic's retained value"),
        ok("publish_first_fragment", "PUBLISH", {"seq": 4, "topic": "video.cam0", "more": True},
           "part 0 (left out) of a publication in fragments: more follow", FRAME_0),
        ok("publish_last_fragment", "PUBLISH", {"seq": 5, "topic": "video.cam0", "part": 1},
           "part 1, the last: more left out", FRAME_1),
        ok("publish_highest", "PUBLISH",
           {"seq": U64_MAX, "topic": "x", "part": 2 ** 32 - 1, "more": True},
           "the highest seq and part, a one-character topic, an empty payload"),
        ok("publish_batch", "PUBLISH", {"seq": 6, "topic": "sensors.temp", "count": 3},
           "a batch of three publications on one topic in one payload frame", BATCH),
        ok("publish_batch_largest", "PUBLISH", {"seq": 7, "topic": "sensors.temp",
                                                "count": 65535},
           "the largest count a batch may have (its payload is not checked by the codec)"),
        ok("publish_credit_first", "PUBLISH_CREDIT", {"acked": 0, "limit": 64},
           "after WELCOME: nothing taken yet, up to seq 64 may come (the broker decides the limit, SPEC 17.4.2)"),
        ok("publish_credit_topped_up", "PUBLISH_CREDIT", {"acked": 100, "limit": 164},
           "100 taken, topped up to acked + 64"),
        ok("publish_credit_held_back", "PUBLISH_CREDIT",
           {"acked": 164, "limit": 164, "held_by": "slow-reader"},
           "all taken, no more granted: the node slow-reader holds this publisher back"),
        ok("deliver", "DELIVER", {"seq": 1, "topic": "sensors.lidar", "from": "lidar-node"},
           "the subscriber's first delivery: lidar-node's publication, payload byte for byte",
           SCAN),
        ok("deliver_retained", "DELIVER",
           {"seq": 2, "topic": "config/robot-7", "from": "planner", "retained": True},
           "a retained value, for a SUBSCRIBE with last", CONFIG),
        ok("deliver_fragment", "DELIVER",
           {"seq": 3, "topic": "video.cam0", "from": "cam-node", "more": True},
           "part 0 of a publication in fragments", FRAME_0),
        ok("deliver_abandoned", "DELIVER",
           {"seq": 4, "topic": "video.cam0", "from": "cam-node", "part": 1, "abandoned": True},
           "the publisher's session ended before its last fragment: an empty payload, drop "
           "what came"),
        ok("deliver_batch", "DELIVER",
           {"seq": 5, "topic": "sensors.temp", "from": "thermo", "count": 3},
           "a batch, delivered as it was published: three publications, one delivery", BATCH),
        ok("bus_ack_none", "BUS_ACK", {"seq": 0}, "no delivery taken yet"),
        ok("bus_ack", "BUS_ACK", {"seq": 32}, "every delivery up to 32 is taken"),
        ok("bus_gap", "BUS_GAP", {"first": 5, "last": 9},
           "deliveries 5..9 were dropped; the next is 10"),
        ok("bus_gap_one", "BUS_GAP", {"first": 1, "last": 1},
           "the very first delivery was dropped"),
    ]

    sub = {"req": 1, "topic": "sensors.lidar"}
    pub = {"seq": 1, "topic": "sensors.lidar"}
    dlv = {"seq": 1, "topic": "sensors.lidar", "from": "lidar-node"}
    invalid_vectors = [
        bad("subscribe_topic_257", "SUBSCRIBE", dict(sub, topic="t" * 257),
            "topics are at most 256 bytes"),
        bad("subscribe_topic_space", "SUBSCRIBE", dict(sub, topic="sensors lidar"),
            "a space is not a topic character"),
        bad("subscribe_topic_non_ascii", "SUBSCRIBE", dict(sub, topic="capteur.\u00e9"),
            "topics are ASCII: no UTF-8 beyond it"),
        bad("subscribe_topic_del", "SUBSCRIBE", dict(sub, topic="sensors\x7f"),
            "0x7F (DEL) is not printable"),
        bad("subscribe_topic_int", "SUBSCRIBE", dict(sub, topic=7), "topic is a str"),
        bad("subscribe_no_topic", "SUBSCRIBE", {"req": 1}, "SUBSCRIBE without topic"),
        bad("subscribe_req_zero", "SUBSCRIBE", dict(sub, req=0), "req is 1..2^64-1"),
        bad("subscribe_prefix_uint", "SUBSCRIBE", dict(sub, prefix=1), "prefix is a bool"),
        bad("subscribe_echo_nil", "SUBSCRIBE", dict(sub, echo=None),
            "an optional field is left out, not nil"),
        bad("unsubscribe_topic_bin", "UNSUBSCRIBE", dict(sub, topic=b"sensors.lidar"),
            "topic is a str, not bin"),
        bad("unsubscribe_no_req", "UNSUBSCRIBE", {"topic": "sensors.lidar"},
            "UNSUBSCRIBE without req"),
        bad("subscribed_code_65536", "SUBSCRIBED",
            {"req": 1, "accepted": False, "code": 65536, "reason": "", "subscriptions": 0},
            "code is 0..65535 (broker-only, decoded before its direction is checked)"),
        bad("subscribed_no_accepted", "SUBSCRIBED",
            {"req": 1, "code": 0, "reason": "", "subscriptions": 0}, "accepted is required"),
        bad("publish_topic_empty", "PUBLISH", dict(pub, topic=""),
            "a publication's topic is 1..256 bytes: only a prefix subscription's may be empty"),
        bad("publish_topic_257", "PUBLISH", dict(pub, topic="t" * 257),
            "topics are at most 256 bytes"),
        bad("publish_topic_tab", "PUBLISH", dict(pub, topic="sensors\tlidar"),
            "a control character is not a topic character"),
        bad("publish_no_topic", "PUBLISH", {"seq": 1}, "PUBLISH without topic"),
        bad("publish_seq_zero", "PUBLISH", dict(pub, seq=0), "seqs count from 1"),
        bad("publish_no_seq", "PUBLISH", {"topic": "sensors.lidar"}, "PUBLISH without seq"),
        bad("publish_part_2_32", "PUBLISH", dict(pub, part=2 ** 32), "part is 0..2^32-1"),
        bad("publish_part_negative", "PUBLISH", dict(pub, part=-1), "part is a uint"),
        bad("publish_part_bool", "PUBLISH", dict(pub, part=True), "part is a uint, not a bool"),
        bad("publish_more_str", "PUBLISH", dict(pub, more="true"), "more is a bool"),
        bad("publish_retain_uint", "PUBLISH", dict(pub, retain=1), "retain is a bool"),
        bad("publish_count_one", "PUBLISH", dict(pub, count=1),
            "a batch holds 2..65535 publications: one travels without count"),
        bad("publish_count_65536", "PUBLISH", dict(pub, count=65536), "count is 2..65535"),
        bad("publish_count_bool", "PUBLISH", dict(pub, count=True), "count is a uint"),
        bad("deliver_count_zero", "DELIVER", dict(dlv, count=0), "count is 2..65535"),
        bad("publish_trailing_bytes", "PUBLISH", pub, "a nil after the map", code=401,
            body_hex=pack(pub) + "c0"),
        bad("publish_credit_no_limit", "PUBLISH_CREDIT", {"acked": 0}, "limit is required"),
        bad("publish_credit_acked_negative", "PUBLISH_CREDIT", {"acked": -1, "limit": 64},
            "acked is a uint"),
        bad("publish_credit_held_by_not_an_id", "PUBLISH_CREDIT",
            {"acked": 0, "limit": 64, "held_by": "slow reader"},
            "held_by follows the peer id rule: no spaces"),
        bad("deliver_from_not_an_id", "DELIVER", dict(dlv, **{"from": "lidar node"}),
            "from follows the peer id rule: no spaces"),
        bad("deliver_no_from", "DELIVER", pub, "DELIVER without from"),
        bad("deliver_topic_empty", "DELIVER", dict(dlv, topic=""), "a delivery has a topic"),
        bad("deliver_abandoned_uint", "DELIVER", dict(dlv, abandoned=1), "abandoned is a bool"),
        bad("deliver_seq_zero", "DELIVER", dict(dlv, seq=0), "seqs count from 1"),
        bad("bus_ack_no_seq", "BUS_ACK", {}, "BUS_ACK without seq"),
        bad("bus_ack_seq_float", "BUS_ACK", {"seq": 32.0},
            "a float is never a uint, even when whole"),
        bad("bus_gap_last_zero", "BUS_GAP", {"first": 1, "last": 0}, "seqs count from 1"),
        bad("bus_gap_first_str", "BUS_GAP", {"first": "1", "last": 2}, "first is a uint"),
        # The role bus is spelled in lower case; a task's kind is never bus.
        bad("hello_role_bus_capitalised", "HELLO",
            {"role": "Bus", "id": "node-1", "heartbeat_ms": 1000, "resources": {}},
            "roles are matched case-sensitively", sender="none"),
        bad("submit_kind_bus", "SUBMIT",
            {"task_id": "task-1", "kind": "bus", "task_info": {}, "requirements": {}},
            "a task's kind is collector or learner, never bus", sender="coordinator"),
    ]

    node = {"id": "lidar-node", "role": "bus", "serial": 21}
    event_vectors = [
        event("bus_joined", "bus.joined",
              {**envelope(16), **node, "resources": {}, "resumed": False}, "a new node"),
        event("bus_left", "bus.left",
              {**envelope(17), **node, "code": 200, "reason": "node closing"},
              "a node said DISCONNECT"),
        event("bus_lost", "bus.lost",
              {**envelope(18), **node, "code": 410,
               "reason": "no message within the liveness window"},
              "a node expired"),
    ]
    return valid_vectors, invalid_vectors, event_vectors
