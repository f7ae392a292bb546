#!/usr/bin/python3
"""Writes the protocol v1 golden vectors (valid.json, invalid.json, events.json).

The bytes come from Python's msgpack, an encoder independent of the C++ codec, with every
map written in the canonical field order of SPEC.md §4/§7/§12.3. Every client's tests decode
these bytes, compare the meaning, and re-encode them byte for byte. Rerun after a spec
change (needs Debian's python3-msgpack):  /usr/bin/python3 protocol/vectors/generate.py
The files go next to this script, or into the directory given as the only argument (a test
writes them elsewhere and compares them with the committed ones).

"fields" is the meaning of the body as JSON. JSON has no bytes, so a msgpack bin value is
written there as {"$bin_hex": "<its bytes in lower-case hex>"} (see to_json below). The
vectors of PUBLISH and DELIVER, which travel with a third frame, give its bytes in
"payload_hex" (bus_vectors.py holds the topic bus's vectors).
"""
import json
import os
import struct
import sys

import msgpack

import bus_vectors

HERE = os.path.dirname(os.path.abspath(__file__))
TYPES = {"HELLO": 0x01, "WELCOME": 0x02, "HEARTBEAT": 0x03, "DISCONNECT": 0x04,
         "ERROR": 0x05, "EVENT": 0x60,
         # task messages (SPEC §12): coordinator <-> broker, broker -> worker, worker -> broker
         "SUBMIT": 0x10, "SUBMITTED": 0x11, "FINISH": 0x12, "CANCEL": 0x13, "DATA_REPLY": 0x14,
         "TASK_EVENT": 0x15, "CAPACITY": 0x16,
         "TASK_START": 0x20, "TASK_CLOSE": 0x21, "LEARN": 0x22, "NO_DATA": 0x23,
         "TASK_ABORT": 0x24, "POLICY_UPDATE": 0x25,
         "STARTED": 0x30, "DATA": 0x31, "INFO": 0x32, "GET_DATA": 0x33, "LEARN_INFO": 0x34,
         "RESULT": 0x35, "TASK_FAILED": 0x36, "POLICY": 0x37, "TASK_ALIVE": 0x38,
         "LEAVING": 0x39,
         # stream flow control and replay (SPEC §12.9)
         "REPLAY": 0x40, "ACK": 0x41, "STREAM_GAP": 0x42, "DATA_CREDIT": 0x48,
         # reliable data (SPEC §12.11)
         "DATA_ACK": 0x49, "DATA_LOST": 0x4A,
         # batched data (SPEC §12.12)
         "DATA_BATCH": 0x4B,
         # operations (SPEC §16)
         "OPS": 0x50, "OPS_REPLY": 0x51,
         # replication between the brokers of a group (SPEC §14.10)
         "SYNC": 0x80, "SNAPSHOT": 0x81, "RECORDS": 0x82, "SYNCED": 0x83,
         # the topic bus (SPEC §17)
         **bus_vectors.TYPES}


def header(type_id, version=1, sig=b"RL"):
    return (sig + bytes([version, type_id])).hex()


def pack(fields):
    return msgpack.packb(fields, use_bin_type=True).hex()


def to_json(value):
    """The meaning of a value as JSON: bytes (msgpack bin) become {"$bin_hex": hex}."""
    if isinstance(value, bytes):
        return {"$bin_hex": value.hex()}
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_json(v) for v in value]
    return value


def valid(name, type_name, fields, note):
    return {"name": name, "type": type_name, "note": note,
            "header_hex": header(TYPES[type_name]), "body_hex": pack(fields),
            "fields": to_json(fields)}


VALID = [
    valid("hello_collector_minimal", "HELLO",
          {"role": "collector", "id": "collector-0", "heartbeat_ms": 1000, "resources": {}},
          "a collector with no announced resources"),
    valid("hello_learner_resources", "HELLO",
          {"role": "learner", "id": "learner-0.rl-ns:22271", "heartbeat_ms": 500,
           "resources": {"cpu": 4, "gpu": 1, "memory_gb": 15.5}},
          "resources sorted by name; whole numbers as integers, others as float64"),
    valid("hello_resume", "HELLO",
          {"role": "collector", "id": "collector-7", "heartbeat_ms": 1000, "resources": {"cpu": 2},
           "session": 0x1122334455667788},
          "a reconnecting peer resumes its session with the token from WELCOME"),
    valid("hello_coordinator", "HELLO",
          {"role": "coordinator", "id": "coordinator", "heartbeat_ms": 250, "resources": {}},
          "coordinators introduce themselves the same way"),
    valid("welcome_new", "WELCOME",
          {"session": 0xfedcba9876543210, "epoch": 0x0123456789abcdef, "heartbeat_ms": 1000,
           "liveness": 3, "max_message": 1048576, "resumed": False},
          "a fresh session"),
    valid("welcome_resumed", "WELCOME",
          {"session": 0x1122334455667788, "epoch": 42, "heartbeat_ms": 100, "liveness": 5,
           "max_message": 65536, "resumed": True},
          "the session moved to this connection"),
    valid("welcome_adopting", "WELCOME",
          {"session": 0x0a0b0c0d0e0f1011, "epoch": 7, "heartbeat_ms": 1000, "liveness": 3,
           "max_message": 1048576, "resumed": False, "stream_acked": 1234},
          "a coordinator's new session takes over the tasks and stream its id left behind"),
    valid("welcome_leader", "WELCOME",
          {"session": 0x5a5a5a5a01020304, "epoch": 0x7766554433221100, "heartbeat_ms": 1000,
           "liveness": 3, "max_message": 16777216, "resumed": False, "leader_epoch": 1207},
          "the leader of a group of brokers names its leadership epoch"),
    valid("heartbeat", "HEARTBEAT", {}, "an empty map"),
    valid("disconnect_goodbye", "DISCONNECT", {"code": 200, "reason": "worker stopping"},
          "an orderly leave"),
    valid("disconnect_expired", "DISCONNECT",
          {"code": 410, "reason": "no message within the liveness window"},
          "the broker expired the session"),
    valid("error_not_ready", "ERROR",
          {"code": 403, "reason": "introduce yourself with HELLO first", "ref_type": 3},
          "a HEARTBEAT before HELLO"),
    valid("error_bad_frame", "ERROR",
          {"code": 400, "reason": "header frame must be 4 bytes"},
          "no ref_type when the type could not be read"),
    valid("error_not_leader", "ERROR",
          {"code": 421, "reason": "a standby of group rlbus: broker-b leads",
           "ref_type": 1, "leader": "tcp://10.0.0.12:7235", "leader_epoch": 1207},
          "a standby refuses a HELLO and names the leader of its group"),
    valid("error_not_leader_unknown", "ERROR",
          {"code": 421, "reason": "a standby of group rlbus: no leader yet", "ref_type": 3},
          "a standby that knows no leader yet: the peer tries its next endpoint"),
]

# Replication between the brokers of a group (SPEC §14.10): a journal record as the file holds
# it (length, CRC-32, type, body), here an ENDED record of task t-1.
JOURNAL_RECORD = bytes.fromhex("08000000" "57518cf2" "0403000000742d31")
VALID += [
    valid("sync", "SYNC", {"member": "broker-b", "leader_epoch": 1207},
          "a standby asks the leader of epoch 1207 for its journal"),
    valid("snapshot_part", "SNAPSHOT",
          {"leader_epoch": 1207, "position": 0, "records": JOURNAL_RECORD, "last": False},
          "a part of the journal, whole records only; more parts follow"),
    valid("snapshot_empty", "SNAPSHOT", {"leader_epoch": 1207, "position": 4096, "last": True},
          "the last part, with no record in it: the journal stands at position 4096"),
    valid("records", "RECORDS", {"leader_epoch": 1207, "position": 4096, "records": JOURNAL_RECORD},
          "records the leader wrote, from position 4096 of its stream"),
    valid("synced", "SYNCED", {"position": 4112},
          "the standby's journal holds the stream up to position 4112"),
]

# Task messages (SPEC §12), with the values a DI-engine-style parallel pipeline would send.
# task_info, meta, info, result, data and body are opaque user data forwarded byte for byte:
# any msgpack is valid inside them; floats stay float64 even when whole (1.0, 21.0).
COLLECTOR_TASK = "collector_task_0a1b2c"
LEARNER_TASK = "learner_task_7f3e9d"
BUFFER = "buffer_9c41e2"
COLLECTOR_INFO = {
    "buffer_id": BUFFER,
    "collector_cfg": {"env": {"env_id": "CartPole-v0", "collector_env_num": 8},
                      "n_sample": 64, "unroll_len": 1, "collect_setting": {"eps": 0.95}},
    "policy_update_path": "/mnt/exp/cartpole_dqn/policy/policy_latest.pth",
    "eval_flag": False,
}
LEARNER_INFO = {
    "buffer_id": BUFFER,
    "policy_id": "policy_5d2a",
    "learner_cfg": {"batch_size": 64, "learning_rate": 0.001, "target_update_freq": 100,
                    "max_iterations": 10000},
    "replay_buffer_cfg": {"replay_buffer_size": 100000, "priority": True, "alpha": 0.6,
                          "beta": 0.4},
}
META_41 = {"env_id": 3, "policy_iter": 1200, "unroll_len": 1, "traj_len": 200,
           "compressor": "lz4", "priority": 1.0, "data_length": 48}
BATCH = [
    {"data_id": "data_c0_000041", "buffer_id": BUFFER, "env_id": 3, "policy_iter": 1200,
     "unroll_len": 1, "priority": 1.0, "replay_buffer_idx": 41, "replay_unique_id": "c0_41"},
    {"data_id": "data_c1_000007", "buffer_id": BUFFER, "env_id": 0, "policy_iter": 1180,
     "unroll_len": 1, "priority": 2.5, "replay_buffer_idx": 7, "replay_unique_id": "c1_7"},
]
# An lz4 frame header and some compressed trajectory bytes (48 in all): every byte value
# class (0x00, 0x7f-0xff) appears, so hex and bin handling are both exercised.
PAYLOAD = bytes([0x04, 0x22, 0x4D, 0x18, 0x64, 0x40, 0xA7, 0x00]) + bytes(
    (i * 37 + 11) & 0xFF for i in range(40))
# Five float64 policy weights, little-endian, as the demo's linear policy writes them.
POLICY_PARAMS = struct.pack("<5d", 0.125, -0.5, 1.75, 2.5, 0.0)

VALID += [
    valid("submit_collector_all_options", "SUBMIT",
          {"task_id": COLLECTOR_TASK, "kind": "collector", "task_info": COLLECTOR_INFO,
           "requirements": {"cpu": 2, "memory_gb": 3.5},
           "start_timeout_ms": 30000, "step_timeout_ms": 60000, "close_timeout_ms": 10000,
           "task_timeout_ms": 3600000, "max_attempts": 3},
          "a collector task with every optional timeout and max_attempts"),
    valid("submit_learner_defaults", "SUBMIT",
          {"task_id": LEARNER_TASK, "kind": "learner", "task_info": LEARNER_INFO,
           "requirements": {"gpu": 1}},
          "no timeouts and no max_attempts: the broker's settings apply"),
    valid("submitted_assigned", "SUBMITTED",
          {"task_id": COLLECTOR_TASK, "accepted": True, "code": 0, "reason": "", "queued": 0},
          "accepted and assigned at once"),
    valid("submitted_queued", "SUBMITTED",
          {"task_id": LEARNER_TASK, "accepted": True, "code": 0, "reason": "", "queued": 3},
          "accepted behind three queued tasks"),
    valid("submitted_queue_full", "SUBMITTED",
          {"task_id": "collector_task_5e6f70", "accepted": False, "code": 412,
           "reason": "task queue is full (1024 tasks waiting)", "queued": 0},
          "refused: the queue is at its bound (412 QUEUE_FULL)"),
    valid("finish", "FINISH", {"task_id": LEARNER_TASK},
          "the coordinator judged the learner task finished"),
    valid("cancel", "CANCEL",
          {"task_id": COLLECTOR_TASK, "reason": "experiment stopped by the operator"},
          "drop the task wherever it is"),
    valid("data_reply_none", "DATA_REPLY",
          {"task_id": LEARNER_TASK, "request_id": 17, "data": None},
          "nil data: not enough data yet"),
    valid("data_reply_none_retry", "DATA_REPLY",
          {"task_id": LEARNER_TASK, "request_id": 19, "data": None, "retry_ms": 160},
          "nil data after four nils in a row: ask again in 160 ms (the NO_DATA says so)"),
    valid("data_reply_batch", "DATA_REPLY",
          {"task_id": LEARNER_TASK, "request_id": 18, "data": BATCH},
          "a batch as a list of metadata dicts"),
    valid("task_event_cancelled_queued", "TASK_EVENT",
          {"seq": 1, "task_id": LEARNER_TASK, "attempt": 0, "event": "cancelled",
           "worker_id": "", "body": {"reason": "experiment stopped by the operator",
                                     "attempt": 0}},
          "a step before any attempt: attempt 0 and no worker (event names: §12.5)"),
    valid("task_event_info", "TASK_EVENT",
          {"seq": 57, "task_id": COLLECTOR_TASK, "attempt": 1, "event": "info",
           "worker_id": "collector-3",
           "body": {"collector_done": False, "envstep_count": 3200, "reward_mean": 21.0}},
          "a collector's INFO relayed to its coordinator: body is the info map byte for byte"),
    valid("task_event_data", "TASK_EVENT",
          {"seq": 58, "task_id": COLLECTOR_TASK, "attempt": 1, "event": "data",
           "worker_id": "collector-3",
           "body": {"data_id": "data_c0_000041", "buffer_id": BUFFER, "meta": META_41,
                    "payload": PAYLOAD}},
          'a DATA relayed with its payload: a bin nested in body, in "fields" as {"$bin_hex": ...}'),
    valid("task_event_finished_kind", "TASK_EVENT",
          {"seq": 61, "task_id": LEARNER_TASK, "attempt": 2, "event": "finished",
           "worker_id": "learner-0", "body": {"learner_step": 5000, "total_loss": 0.125},
           "kind": "learner"},
          "an event that ends a task names its kind, after the body: an adopting coordinator "
          "learns it here"),
    # CAPACITY (SPEC §12.10): live workers of a kind, after a join, an end, or as a snapshot.
    valid("capacity_increase", "CAPACITY",
          {"kind": "collector", "change": "increase", "worker_id": "collector-3", "count": 4},
          "a fourth collector joined"),
    valid("capacity_decrease", "CAPACITY",
          {"kind": "learner", "change": "decrease", "worker_id": "learner-0", "count": 0},
          "the only learner's session ended"),
    valid("capacity_snapshot", "CAPACITY",
          {"kind": "collector", "change": "snapshot", "worker_id": "", "count": 12},
          "the count right after a coordinator's WELCOME: no worker named"),
    valid("task_start_collector", "TASK_START",
          {"task_id": COLLECTOR_TASK, "attempt": 1, "kind": "collector",
           "task_info": COLLECTOR_INFO},
          "first attempt; task_info exactly as in SUBMIT"),
    valid("task_start_learner_retry", "TASK_START",
          {"task_id": LEARNER_TASK, "attempt": 2, "kind": "learner", "task_info": LEARNER_INFO},
          "the second attempt, after the first worker was lost"),
    valid("task_close", "TASK_CLOSE", {"task_id": COLLECTOR_TASK, "attempt": 1},
          "finish and answer with RESULT"),
    valid("learn", "LEARN",
          {"task_id": LEARNER_TASK, "attempt": 1, "request_id": 18, "data": BATCH},
          "the batch from DATA_REPLY, forwarded byte for byte"),
    valid("no_data", "NO_DATA",
          {"task_id": LEARNER_TASK, "attempt": 1, "request_id": 17, "retry_ms": 500},
          "DATA_REPLY had nil data: ask again after 500 ms"),
    valid("task_abort", "TASK_ABORT",
          {"task_id": COLLECTOR_TASK, "attempt": 1,
           "reason": "cancelled by its coordinator: experiment stopped by the operator"},
          "stop this attempt now"),
    valid("started", "STARTED", {"task_id": COLLECTOR_TASK, "attempt": 1},
          "the worker took the task"),
    valid("data_inline_payload", "DATA",
          {"task_id": COLLECTOR_TASK, "attempt": 1, "data_id": "data_c0_000041",
           "buffer_id": BUFFER, "meta": META_41, "payload": PAYLOAD},
          'a 48-byte bin payload; in "fields" as {"$bin_hex": ...}'),
    valid("data_by_reference", "DATA",
          {"task_id": COLLECTOR_TASK, "attempt": 1, "data_id": "data_c0_000042",
           "buffer_id": BUFFER,
           "meta": {"env_id": 5, "policy_iter": 1200, "unroll_len": 1, "traj_len": 200,
                    "priority": 0.75,
                    "data_path": "/mnt/exp/cartpole_dqn/data/data_c0_000042"}},
          "no payload: the data travels another way, named by data_id and meta"),
    valid("info_collector", "INFO",
          {"task_id": COLLECTOR_TASK, "attempt": 1,
           "info": {"collector_done": False, "env_num": 8, "episode_count": 16,
                    "envstep_count": 3200, "train_sample_count": 3200,
                    "avg_envstep_per_sec": 1523.5, "reward_mean": 21.0, "reward_std": 9.25}},
          "collector progress"),
    valid("info_indexed", "INFO",
          {"task_id": COLLECTOR_TASK, "attempt": 1, "info": {"collector_done": True},
           "index": 17},
          "numbered with the attempt's DATA: relayed once, in order, sent again after a resume"),
    valid("learn_info_indexed", "LEARN_INFO",
          {"task_id": LEARNER_TASK, "attempt": 1, "buffer_id": BUFFER,
           "info": {"learner_done": False}, "index": 3},
          "numbered within the learner attempt: relayed once, in order, sent again after a resume"),
    valid("get_data", "GET_DATA",
          {"task_id": LEARNER_TASK, "attempt": 1, "request_id": 18, "buffer_id": BUFFER,
           "batch_size": 64, "cur_learner_iter": 1200},
          "a learner asks its coordinator for a batch"),
    valid("learn_info", "LEARN_INFO",
          {"task_id": LEARNER_TASK, "attempt": 1, "buffer_id": BUFFER,
           "info": {"learner_step": 1201,
                    "priority_info": {"priority": [0.5, 1.25, 0.875],
                                      "replay_buffer_idx": [41, 7, 1033],
                                      "replay_unique_id": ["c0_41", "c1_7", "c0_1033"]},
                    "learner_done": False, "cur_lr": 0.001, "total_loss": 0.375}},
          "one learning step, with the new priorities for the replay buffer"),
    valid("result_collector", "RESULT",
          {"task_id": COLLECTOR_TASK, "attempt": 1,
           "result": {"collector_done": True, "episode_count": 64, "envstep_count": 12800,
                      "reward_mean": 195.5, "finish_time": 1796000123.25}},
          "the answer to TASK_CLOSE"),
    valid("result_learner", "RESULT",
          {"task_id": LEARNER_TASK, "attempt": 2,
           "result": {"learner_step": 10000, "buffer_id": BUFFER, "learner_done": True,
                      "policy_path": "/mnt/exp/cartpole_dqn/policy/iteration_10000.pth"}},
          "a learner's final result, from its second attempt"),
    valid("task_failed", "TASK_FAILED",
          {"task_id": COLLECTOR_TASK, "attempt": 2,
           "reason": "collector handler raised RuntimeError: env 3 step failed"},
          "the worker's handler failed"),
    valid("task_failed_with_result", "TASK_FAILED",
          {"task_id": LEARNER_TASK, "attempt": 1, "reason": "loss is NaN at step 1201",
           "result": {"learner_step": 1201, "total_loss": 4.25,
                      "last_checkpoint": "/mnt/exp/cartpole_dqn/policy/iteration_1200.pth"}},
          "the worker's account of the failure, forwarded in requeued or failed"),
    valid("task_event_requeued_with_result", "TASK_EVENT",
          {"seq": 60, "task_id": LEARNER_TASK, "attempt": 1, "event": "requeued",
           "worker_id": "learner-0",
           "body": {"reason": "worker reported: loss is NaN at step 1201", "attempt": 1,
                    "result": {"learner_step": 1201, "total_loss": 4.25,
                               "last_checkpoint":
                                   "/mnt/exp/cartpole_dqn/policy/iteration_1200.pth"}}},
          "the TASK_FAILED's result, byte for byte, after reason and attempt"),
    valid("task_alive", "TASK_ALIVE", {"task_id": LEARNER_TASK, "attempt": 2},
          "still working on attempt 2: its start or step deadline moves on"),
    # policies (SPEC §13)
    valid("policy_inline", "POLICY",
          {"policy_id": "cartpole", "version": 7, "params": POLICY_PARAMS},
          'version 7 with its parameters inline (five float64, little-endian); in "fields" as {"$bin_hex": ...}'),
    valid("policy_by_reference", "POLICY",
          {"policy_id": "dqn.main", "version": 1200,
           "ref": "/mnt/exp/cartpole_dqn/policy/iteration_1200.pth"},
          "a checkpoint the workers load themselves"),
    valid("submit_with_policy", "SUBMIT",
          {"task_id": COLLECTOR_TASK, "kind": "collector", "task_info": COLLECTOR_INFO,
           "requirements": {}, "policy_id": "cartpole"},
          "each attempt starts with the latest version of policy cartpole"),
    valid("submit_with_queue_timeout", "SUBMIT",
          {"task_id": COLLECTOR_TASK, "kind": "collector", "task_info": COLLECTOR_INFO,
           "requirements": {"gpu": 1}, "max_attempts": 2, "queue_timeout_ms": 5000},
          "fails if no worker takes it within 5 s of being queued (each time it is queued)"),
    valid("task_start_with_policy", "TASK_START",
          {"task_id": COLLECTOR_TASK, "attempt": 1, "kind": "collector",
           "task_info": COLLECTOR_INFO, "policy_id": "cartpole", "policy_version": 7,
           "policy_params": POLICY_PARAMS},
          "the latest version the broker held when the attempt started"),
    valid("task_start_learner_policy_ref", "TASK_START",
          {"task_id": LEARNER_TASK, "attempt": 2, "kind": "learner", "task_info": LEARNER_INFO,
           "policy_id": "dqn.main", "policy_version": 1200,
           "policy_ref": "/mnt/exp/cartpole_dqn/policy/iteration_1200.pth"},
          "a restarted learner resumes from the checkpoint its first attempt published"),
    valid("policy_update_params", "POLICY_UPDATE",
          {"task_id": COLLECTOR_TASK, "attempt": 1, "policy_id": "cartpole",
           "policy_version": 8, "policy_params": POLICY_PARAMS},
          "version 8 was published while the attempt ran"),
    valid("policy_update_ref", "POLICY_UPDATE",
          {"task_id": COLLECTOR_TASK, "attempt": 2, "policy_id": "dqn.main",
           "policy_version": 1300,
           "policy_ref": "/mnt/exp/cartpole_dqn/policy/iteration_1300.pth"},
          "a newer checkpoint for a running attempt"),
    valid("data_with_policy_version", "DATA",
          {"task_id": COLLECTOR_TASK, "attempt": 1, "data_id": "data_c0_000043",
           "buffer_id": BUFFER, "meta": META_41, "policy_version": 7},
          "collected with version 7 of the task's policy"),
    # stream flow control and replay (SPEC §12.9)
    valid("replay_after_reconnect", "REPLAY", {"from_seq": 1201},
          "a coordinator back on a new connection: send again from 1201"),
    valid("replay_first", "REPLAY", {"from_seq": 1},
          "a new session's first message: nothing old, turn on the window"),
    valid("ack", "ACK", {"seq": 1232}, "every event up to 1232 is processed"),
    valid("ack_none", "ACK", {"seq": 0}, "nothing processed yet"),
    valid("stream_gap", "STREAM_GAP", {"first": 3, "last": 70002},
          "3..70002 left the ring before they were asked for; the stream goes on at 70003"),
    valid("data_credit", "DATA_CREDIT", {"task_id": COLLECTOR_TASK, "attempt": 1, "limit": 256},
          "the attempt may send DATA until it has sent 256 in all"),
    valid("data_credit_none_yet", "DATA_CREDIT",
          {"task_id": COLLECTOR_TASK, "attempt": 2, "limit": 0},
          "before TASK_START: the attempt is credited but has no credit yet"),
    # reliable data (SPEC §12.11)
    valid("data_indexed", "DATA",
          {"task_id": COLLECTOR_TASK, "attempt": 1, "data_id": "data_c0_000044",
           "buffer_id": BUFFER, "meta": META_41, "index": 44},
          "the attempt's 44th DATA: sent again after a reconnect, relayed once"),
    valid("data_ack", "DATA_ACK",
          {"task_id": COLLECTOR_TASK, "attempt": 1, "relayed": 64, "resend": False},
          "the broker relayed the attempt's DATA 1..64"),
    valid("data_ack_resend", "DATA_ACK",
          {"task_id": COLLECTOR_TASK, "attempt": 1, "relayed": 40, "resend": True},
          "a DATA past 41 came first: send again from 41"),
    valid("data_lost", "DATA_LOST",
          {"task_id": COLLECTOR_TASK, "attempt": 1, "first": 41, "last": 52},
          "the worker dropped DATA 41..52 unconfirmed: they will never come"),
]


# Who sends an invalid vector to a live broker to be answered exactly `error_code` (SPEC
# §5.6.1): HELLO from a connection without a session; other types from an idle session of the
# role that sends them, or, for a type only the broker sends, of a role that receives it.
SENDERS = {"HELLO": "none", "OPS": "none", "DISCONNECT": "collector", "EVENT": "collector",
           "SUBMIT": "coordinator", "REPLAY": "coordinator", "ACK": "coordinator",
           "CAPACITY": "coordinator", "STREAM_GAP": "coordinator",
           "GET_DATA": "learner", "LEARN_INFO": "learner", "POLICY": "learner"}


def invalid(name, body_hex, code, note, type_name="HELLO", sender=None):
    return {"name": name, "type": type_name, "note": note, "header_hex": header(TYPES[type_name]),
            "body_hex": body_hex, "error_code": code,
            "sender": sender or SENDERS.get(type_name, "collector")}


GOOD = {"role": "collector", "id": "c0", "heartbeat_ms": 1000, "resources": {}}


def without(key):
    return pack({k: v for k, v in GOOD.items() if k != key})


def with_field(key, value):
    d = dict(GOOD)
    d[key] = value
    return pack(d)


def nested(levels):
    value = 0
    for _ in range(levels):
        value = [value]
    return value


deep = nested(40)

INVALID = [
    invalid("array32_bomb", "dd1e1e1e1e1e", 401,
            "an array32 header claiming 505 million elements: must not allocate"),
    invalid("map32_bomb", "df7fffffff", 401, "a map32 header claiming 2^31 entries"),
    invalid("empty_body", "", 401, "no bytes at all"),
    invalid("truncated_map", pack(GOOD)[:-4], 401, "the last two bytes are missing"),
    invalid("trailing_bytes", pack(GOOD) + "c0", 401, "a nil after the map"),
    invalid("not_a_map", pack(["collector", "c0", 1000]), 401, "an array instead of a map"),
    invalid("non_string_key", "81" + "01" + "a178", 401, "{1: 'x'}"),
    invalid("duplicate_key", "82" + "a2" + b"id".hex() + "a161" + "a2" + b"id".hex() + "a162",
            401, "{'id': 'a', 'id': 'b'}"),
    invalid("ext_type", "81" + "a178" + "d40100", 401, "an ext value (fixext1)"),
    invalid("too_deep", with_field("extra", deep), 401, "an unknown field nested 40 deep"),
    invalid("too_deep_by_one", with_field("extra", nested(16)), 401,
            "the top map and 16 arrays inside it: 17 levels, one past the limit (15 arrays pass)"),
    invalid("missing_id", without("id"), 402, "HELLO without id"),
    invalid("missing_role", without("role"), 402, "HELLO without role"),
    invalid("role_wrong_type", with_field("role", 1), 402, "role is an integer"),
    invalid("role_unknown", with_field("role", "trainer"), 402, "no such role"),
    invalid("id_bad_chars", with_field("id", "bad id!"), 402, "space and ! are not allowed"),
    invalid("id_empty", with_field("id", ""), 402, "ids are 1-128 characters"),
    invalid("id_too_long", with_field("id", "x" * 129), 402, "ids are 1-128 characters"),
    invalid("heartbeat_too_small", with_field("heartbeat_ms", 5), 402, "below 10 ms"),
    invalid("heartbeat_negative", with_field("heartbeat_ms", -1), 402, "a negative integer"),
    invalid("heartbeat_float", with_field("heartbeat_ms", 1000.0), 402, "a float"),
    invalid("resource_negative", with_field("resources", {"cpu": -1}), 402, "negative"),
    invalid("resource_not_number", with_field("resources", {"cpu": "4"}), 402, "a string"),
    invalid("resource_nan", with_field("resources", {"cpu": float("nan")}), 402, "NaN"),
    invalid("too_many_resources",
            with_field("resources", {f"r{i:02d}": 1 for i in range(33)}), 402, "33 entries"),
    invalid("session_zero", with_field("session", 0), 402, "tokens are never 0"),
    invalid("disconnect_no_code", pack({"reason": "bye"}), 402, "DISCONNECT without code",
            "DISCONNECT"),
    invalid("event_type_on_router", pack({}), 404, "EVENT is never a ROUTER message", "EVENT"),
]

VALID.append(valid("leaving_in_30s", "LEAVING", {"deadline_ms": 30000},
                   "a spot instance's notice: the running task may take 30 s more"))
VALID.append(valid("leaving_now", "LEAVING", {"deadline_ms": 0},
                   "SIGTERM with no grace: the running task is handed back at once"))
VALID.append(valid("data_meta_nests_14", "DATA",
                   {"task_id": COLLECTOR_TASK, "attempt": 1, "data_id": "d", "buffer_id": BUFFER,
                    "meta": {"x": nested(13)}},
                   "meta and 13 arrays in it: the deepest meta a data event can carry "
                   "(SPEC §12.2.3.1)"))


def invalid_task(name, type_name, fields, note, code=402):
    return invalid(name, pack(fields), code, note, type_name)


# batched data (SPEC §12.12): items stand for DATA first_index, first_index + 1, ...
def batch_item(n, **extra):
    return {"data_id": f"data_c0_{n:06d}", "buffer_id": BUFFER,
            "meta": {"env_id": n % 4, "unroll_len": 32}, **extra}


VALID.append(valid("data_batch_three", "DATA_BATCH",
                   {"task_id": COLLECTOR_TASK, "attempt": 1, "first_index": 45,
                    "items": [batch_item(45), batch_item(46, payload=b"\x00\x01\xfe\xff"),
                              batch_item(47, policy_version=7)]},
                   "DATA 45, 46 (with an inline payload) and 47 (collected with policy "
                   "version 7) in one message"))
VALID.append(valid("data_batch_meta_nests_12", "DATA_BATCH",
                   {"task_id": COLLECTOR_TASK, "attempt": 2, "first_index": 2 ** 63,
                    "items": [{"data_id": "", "buffer_id": "", "meta": {"x": nested(11)}}]},
                   "the highest first index, empty ids, and meta with 11 arrays in it: the "
                   "deepest meta a data_batch event can carry (SPEC §12.2.3.1)"))


INVALID += [
    invalid_task("task_id_space", "STARTED", {"task_id": "collector task 0a1b2c", "attempt": 1},
                 "task ids follow the peer id rule: no spaces"),
    invalid_task("attempt_zero", "STARTED", {"task_id": COLLECTOR_TASK, "attempt": 0},
                 "attempts count from 1"),
    invalid_task("attempt_too_big", "RESULT",
                 {"task_id": COLLECTOR_TASK, "attempt": 1001, "result": {}},
                 "attempts are 1..1000"),
    invalid_task("info_nil", "INFO", {"task_id": COLLECTOR_TASK, "attempt": 1, "info": None},
                 "info must be a map, not nil"),
    invalid_task("info_array", "INFO",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "info": [1, 2, 3]},
                 "info must be a map, not an array"),
    invalid_task("submit_kind_unknown", "SUBMIT",
                 {"task_id": COLLECTOR_TASK, "kind": "trainer", "task_info": {},
                  "requirements": {}},
                 "kind follows the role rule"),
    invalid_task("data_payload_str", "DATA",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "data_id": "data_c0_000041",
                  "buffer_id": BUFFER, "meta": {}, "payload": PAYLOAD.hex()},
                 "payload must be bin, not str"),
    invalid_task("capacity_change_unknown", "CAPACITY",
                 {"kind": "collector", "change": "grow", "worker_id": "collector-3", "count": 4},
                 "change is increase, decrease or snapshot"),
    invalid_task("capacity_count_negative", "CAPACITY",
                 {"kind": "learner", "change": "decrease", "worker_id": "learner-0", "count": -1},
                 "count is a uint"),
    invalid_task("get_data_no_batch_size", "GET_DATA",
                 {"task_id": LEARNER_TASK, "attempt": 1, "request_id": 18, "buffer_id": BUFFER,
                  "cur_learner_iter": 1200},
                 "GET_DATA without batch_size"),
    invalid_task("policy_ref_and_params", "POLICY",
                 {"policy_id": "cartpole", "version": 8, "ref": "/tmp/p8",
                  "params": POLICY_PARAMS},
                 "a version is a reference or inline params, not both"),
    invalid_task("policy_empty", "POLICY", {"policy_id": "cartpole", "version": 8},
                 "a version is a reference or inline params: neither is not a policy"),
    invalid_task("policy_version_zero", "POLICY",
                 {"policy_id": "cartpole", "version": 0, "params": POLICY_PARAMS},
                 "versions count from 1"),
    invalid_task("task_start_policy_without_version", "TASK_START",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "kind": "collector",
                  "task_info": {}, "policy_id": "cartpole", "policy_params": POLICY_PARAMS},
                 "the policy fields of TASK_START travel together"),
    invalid_task("replay_from_zero", "REPLAY", {"from_seq": 0}, "seqs count from 1"),
    invalid_task("replay_from_negative", "REPLAY", {"from_seq": -1}, "from_seq is a uint"),
    invalid_task("ack_no_seq", "ACK", {}, "ACK without seq"),
    invalid_task("ack_seq_str", "ACK", {"seq": "12"}, "seq is a uint, not a str"),
    invalid_task("stream_gap_first_zero", "STREAM_GAP", {"first": 0, "last": 4},
                 "seqs count from 1"),
    invalid_task("data_credit_attempt_zero", "DATA_CREDIT",
                 {"task_id": COLLECTOR_TASK, "attempt": 0, "limit": 8}, "attempts count from 1"),
    invalid_task("data_credit_no_limit", "DATA_CREDIT",
                 {"task_id": COLLECTOR_TASK, "attempt": 1}, "DATA_CREDIT without limit"),
    invalid_task("data_index_zero", "DATA",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "data_id": "d", "buffer_id": BUFFER,
                  "meta": {}, "index": 0}, "DATA indexes count from 1"),
    invalid_task("data_ack_resend_uint", "DATA_ACK",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "relayed": 3, "resend": 1},
                 "resend is a bool"),
    invalid_task("task_failed_result_nil", "TASK_FAILED",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "reason": "x", "result": None},
                 "result is left out when there is none: nil is a type error"),
    invalid_task("task_failed_result_array", "TASK_FAILED",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "reason": "x", "result": [1, 2]},
                 "result must be a map"),
    invalid_task("submit_queue_timeout_zero", "SUBMIT",
                 {"task_id": COLLECTOR_TASK, "kind": "collector", "task_info": {},
                  "requirements": {}, "queue_timeout_ms": 0},
                 "queue_timeout_ms is 1..86400000: leave it out for the broker's setting"),
    invalid_task("data_reply_retry_too_long", "DATA_REPLY",
                 {"task_id": LEARNER_TASK, "request_id": 19, "data": None,
                  "retry_ms": 3600001},
                 "retry_ms is at most 3600000 (an hour)"),
    invalid_task("policy_update_ref_and_params", "POLICY_UPDATE",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "policy_id": "cartpole",
                  "policy_version": 8, "policy_ref": "/tmp/p8", "policy_params": POLICY_PARAMS},
                 "a version is a reference or inline params, not both"),
    invalid_task("policy_update_no_version", "POLICY_UPDATE",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "policy_id": "cartpole",
                  "policy_ref": "/tmp/p8"},
                 "policy_version is required"),
    invalid_task("task_alive_attempt_zero", "TASK_ALIVE",
                 {"task_id": LEARNER_TASK, "attempt": 0}, "attempts count from 1"),
    invalid_task("task_alive_no_task_id", "TASK_ALIVE", {"attempt": 1},
                 "TASK_ALIVE without task_id"),
    invalid_task("data_lost_first_zero", "DATA_LOST",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "first": 0, "last": 3},
                 "DATA indexes count from 1"),
    invalid_task("leaving_no_deadline", "LEAVING", {}, "LEAVING without deadline_ms"),
    invalid_task("leaving_deadline_too_long", "LEAVING", {"deadline_ms": 86400001},
                 "deadline_ms is at most 86400000 (a day)"),
    # user maps relayed one level deeper nest at most 14 levels (SPEC §12.2.3.1): each body
    # below is 16 levels deep, within §5.1, but its event would be 17
    invalid_task("data_meta_nests_15", "DATA",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "data_id": "d", "buffer_id": BUFFER,
                  "meta": {"x": nested(14)}},
                 "meta and 14 arrays in it: 15 levels, one more than the data event can carry"),
    invalid_task("learn_info_info_nests_15", "LEARN_INFO",
                 {"task_id": LEARNER_TASK, "attempt": 1, "buffer_id": BUFFER,
                  "info": {"x": nested(14)}},
                 "info and 14 arrays in it: one level more than the learn_info event can carry"),
    invalid_task("task_failed_result_nests_15", "TASK_FAILED",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "reason": "x",
                  "result": {"x": nested(14)}},
                 "result and 14 arrays in it: one level more than the failed event can carry"),
    invalid_task("data_batch_no_items", "DATA_BATCH",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "first_index": 1, "items": []},
                 "a batch carries at least one item"),
    invalid_task("data_batch_items_not_array", "DATA_BATCH",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "first_index": 1,
                  "items": batch_item(1)},
                 "items is an array of items, not one item"),
    invalid_task("data_batch_item_not_map", "DATA_BATCH",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "first_index": 1,
                  "items": [batch_item(1), "data_c0_000002"]},
                 "every item is a map"),
    invalid_task("data_batch_item_no_buffer_id", "DATA_BATCH",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "first_index": 1,
                  "items": [batch_item(1), {"data_id": "d2", "meta": {}}]},
                 "the second item lacks buffer_id"),
    invalid_task("data_batch_item_meta_not_map", "DATA_BATCH",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "first_index": 1,
                  "items": [{"data_id": "d", "buffer_id": BUFFER, "meta": [1, 2]}]},
                 "an item's meta is a map"),
    invalid_task("data_batch_item_payload_str", "DATA_BATCH",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "first_index": 1,
                  "items": [batch_item(1, payload="text")]},
                 "an item's payload is bin, not str"),
    invalid_task("data_batch_item_meta_nests_13", "DATA_BATCH",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "first_index": 1,
                  "items": [{"data_id": "d", "buffer_id": BUFFER, "meta": {"x": nested(12)}}]},
                 "meta and 12 arrays in it: 13 levels, one more than a data_batch event can "
                 "carry"),
    invalid_task("data_batch_first_index_zero", "DATA_BATCH",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "first_index": 0,
                  "items": [batch_item(1)]},
                 "DATA indexes count from 1"),
    invalid_task("data_batch_first_index_past_2_63", "DATA_BATCH",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "first_index": 2 ** 63 + 1,
                  "items": [batch_item(1)]},
                 "first_index is at most 2^63, so no batch's last index overflows"),
    invalid_task("data_batch_1025_items", "DATA_BATCH",
                 {"task_id": COLLECTOR_TASK, "attempt": 1, "first_index": 1,
                  "items": [{}] * 1025},
                 "1025 items: past the array limit of SPEC §5.1", code=401),
]


# operations (SPEC §16): an operator's questions and orders, and the broker's answers
VALID += [
    valid("ops_status", "OPS", {"request_id": 1, "verb": "status"},
          "the broker's state: the smallest OPS"),
    valid("ops_tasks_filtered", "OPS",
          {"request_id": 2, "verb": "tasks", "state": "running", "kind": "collector",
           "coordinator": "coordinator", "limit": 50},
          "running collector tasks of one coordinator, at most 50"),
    valid("ops_tasks_page", "OPS",
          {"request_id": 4, "verb": "tasks", "limit": 1000, "offset": 1000},
          "the second page of 1000 live tasks"),
    valid("ops_drain", "OPS", {"request_id": 3, "verb": "drain", "worker": "collector_0"},
          "no new task for collector_0"),
    valid("ops_set", "OPS",
          {"request_id": 2 ** 64 - 1, "verb": "set", "key": "tasks.max-queue", "value": "5000"},
          "a setting changed at run time, with the highest request id"),
    valid("ops_reply_set", "OPS_REPLY",
          {"request_id": 2 ** 64 - 1, "verb": "set",
           "result": {"key": "tasks.max-queue", "value": "5000", "was": "10000"}},
          "the answer to ops_set"),
    valid("ops_reply_workers", "OPS_REPLY",
          {"request_id": 4, "verb": "workers",
           "result": {"workers": [{"id": "collector_0", "role": "collector",
                                   "resources": {"cpu": 1.0}, "task": COLLECTOR_TASK,
                                   "attempt": 1, "heartbeat_age_ms": 12, "quarantined": False,
                                   "leaving": False, "drained": True}],
                      "total": 1}},
          "one worker, drained, still running its task"),
]
INVALID += [
    invalid_task("ops_unknown_verb", "OPS", {"request_id": 1, "verb": "restart"},
                 "verb is one of status, workers, tasks, drain, undrain, evict, set"),
    invalid_task("ops_request_id_zero", "OPS", {"request_id": 0, "verb": "status"},
                 "request ids count from 1"),
    invalid_task("ops_no_verb", "OPS", {"request_id": 1}, "verb is required"),
    invalid_task("ops_limit_zero", "OPS", {"request_id": 1, "verb": "tasks", "limit": 0},
                 "limit is 1..10000"),
    invalid_task("ops_limit_10001", "OPS", {"request_id": 1, "verb": "workers", "limit": 10001},
                 "limit is 1..10000"),
    invalid_task("ops_worker_not_an_id", "OPS",
                 {"request_id": 1, "verb": "drain", "worker": "collector 0"},
                 "worker follows the peer id rule: no spaces"),
    invalid_task("ops_key_empty", "OPS",
                 {"request_id": 1, "verb": "set", "key": "", "value": "1"},
                 "key is 1..64 bytes"),
    invalid_task("ops_state_unknown", "OPS",
                 {"request_id": 1, "verb": "tasks", "state": "done"},
                 "state is queued, starting, running or closing"),
    invalid_task("ops_kind_coordinator", "OPS",
                 {"request_id": 1, "verb": "tasks", "kind": "coordinator"},
                 "kind is collector or learner"),
    invalid_task("ops_reply_result_not_map", "OPS_REPLY",
                 {"request_id": 1, "verb": "status", "result": [1, 2]},
                 "result is a map (decoded before the direction is checked, SPEC §3.5.2)"),
]


def event(name, topic, fields, note):
    return {"name": name, "topic": topic, "note": note, "header_hex": header(TYPES["EVENT"]),
            "body_hex": pack(fields), "fields": fields}


def envelope(seq):
    return {"seq": seq, "epoch": 0x0123456789abcdef, "ts_ms": 1796000000000}


EVENTS = [
    event("worker_joined", "worker.joined",
          {**envelope(1), "id": "collector-0", "role": "collector", "serial": 1,
           "resources": {"cpu": 4}, "resumed": False}, "a new collector"),
    event("worker_joined_resumed", "worker.joined",
          {**envelope(2), "id": "learner-0", "role": "learner", "serial": 2,
           "resources": {"gpu": 1}, "resumed": True}, "a learner resumed its session"),
    event("worker_lost", "worker.lost",
          {**envelope(3), "id": "collector-0", "role": "collector", "serial": 1, "code": 410,
           "reason": "no message within the liveness window"}, "expired"),
    event("coordinator_left", "coordinator.left",
          {**envelope(4), "id": "coordinator", "role": "coordinator", "serial": 3, "code": 200,
           "reason": "done"}, "an orderly leave"),
    event("broker_heartbeat", "broker.heartbeat",
          {**envelope(5), "peers": 12, "uptime_ms": 60000}, "periodic status"),
    event("broker_stopping", "broker.stopping", {**envelope(6), "drain_ms": 0},
          "a stop without a drain (--drain-ms 0)"),
    event("broker_stopping_drain", "broker.stopping", {**envelope(6), "drain_ms": 10000},
          "a stop that waits up to 10 s for running tasks (SPEC §11.2)"),
    event("unknown_topic", "future.topic", envelope(7),
          "a topic this version does not know: the envelope still decodes"),
    # task.<coordinator>.<event> (SPEC §12.8.4): a copy of each TASK_EVENT without user data.
    event("task_assigned", "task.coordinator.assigned",
          {**envelope(8), "task_id": COLLECTOR_TASK, "kind": "collector", "attempt": 1,
           "worker_id": "collector-3", "detail": "collector-3"},
          "an attempt began; detail is the worker id"),
    event("task_data", "task.coordinator.data",
          {**envelope(9), "task_id": COLLECTOR_TASK, "kind": "collector", "attempt": 1,
           "worker_id": "collector-3", "detail": "data_c0_000041"},
          "a DATA step; detail is its data_id, the data itself is not published"),
    event("task_requeued", "task.coordinator.requeued",
          {**envelope(10), "task_id": LEARNER_TASK, "kind": "learner", "attempt": 1,
           "worker_id": "learner-0", "detail": "step timeout"},
          "an attempt ended and the task waits again; detail is the reason"),
    event("task_cancelled_queued", "task.coordinator.cancelled",
          {**envelope(11), "task_id": LEARNER_TASK, "kind": "learner", "attempt": 0,
           "worker_id": "", "detail": "experiment stopped by the operator"},
          "cancelled before any attempt: attempt 0 and no worker"),
    # capacity.<kind> (SPEC §12.10.3): the PUB copy of a CAPACITY increase or decrease.
    event("capacity_collector_increase", "capacity.collector",
          {**envelope(12), "kind": "collector", "change": "increase", "worker_id": "collector-3",
           "count": 4},
          "a fourth collector joined"),
    event("capacity_learner_decrease", "capacity.learner",
          {**envelope(13), "kind": "learner", "change": "decrease", "worker_id": "learner-0",
           "count": 0},
          "the only learner's session ended"),
    event("worker_quarantined", "worker.quarantined",
          {**envelope(15), "id": "collector-2", "role": "collector", "failures": 5,
           "quarantine_ms": 20000,
           "reason": "worker reported: gym.error.ResetNeeded: reset before step"},
          "collector-2 ended 5 attempts in a row badly; its second quarantine in a row"),
    event("policy_published", "policy.cartpole",
          {**envelope(14), "policy_id": "cartpole", "version": 7, "publisher": "learner-0",
           "size": 40},
          "the broker now holds version 7; the parameters themselves are not published"),
]


# the topic bus (SPEC §17)
_bus = bus_vectors.build(
    valid, lambda name, t, body, code, note, sender: invalid(name, body, code, note, t, sender),
    event, envelope, pack)
VALID += _bus[0]
INVALID += _bus[1]
EVENTS += _bus[2]


def write(out_dir, name, items):
    with open(os.path.join(out_dir, name), "w") as f:
        json.dump({"protocol": "rlbus", "version": 1, "vectors": items}, f, indent=1)
        f.write("\n")


def main(argv):
    if len(argv) > 2:
        sys.exit("usage: generate.py [OUTPUT_DIR]")
    out_dir = argv[1] if len(argv) == 2 else HERE
    write(out_dir, "valid.json", VALID)
    write(out_dir, "invalid.json", INVALID)
    write(out_dir, "events.json", EVENTS)


if __name__ == "__main__":
    main(sys.argv)
