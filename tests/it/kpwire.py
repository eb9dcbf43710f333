"""The kp_wire protocol (common/kp_wire.h) in Python, for tests that stand in for
libkprof_inject.so: struct packing of every message, and a small
SOCK_SEQPACKET client. Host byte order (little endian here), C layouts with their padding."""
import os
import socket
import struct

MAGIC = 0x4B505731
VERSION = 1
MAX_MSG = 64 * 1024

HELLO, WELCOME, ARM, DISARM, STATUS, STRINGS, RECORDS, WINDOW_BEGIN, WINDOW_END, STEP = range(1, 11)
CTL_REQUEST = 20  # retired local control plane: the agent closes the connection

REC_KERNEL, REC_MEMCPY, REC_MEMSET, REC_API, REC_SYNC, REC_RANGE = range(1, 7)
ST_DORMANT, ST_ARMED, ST_WARMUP, ST_CAPTURING, ST_FLUSHING, ST_DONE, ST_FAILED = range(7)

HDR = struct.Struct("<IHHII")
HELLO_S = struct.Struct("<IIiiiiIIqQ256s256s256s")
WELCOME_S = struct.Struct("<IIQ256s")
ARM_S = struct.Struct("<QQqIIQQ")
STATUS_S = struct.Struct("<QIiqQQQQQ256s")
WINDOW_S = struct.Struct("<QQqqqqQQQQQqq")
STEP_S = struct.Struct("<qqII")
RECS_S = struct.Struct("<II")
KERNEL_S = struct.Struct("<qqQQ14I")
MEMCPY_S = struct.Struct("<qqQQ8I")
MEMSET_S = struct.Struct("<qqQQ6I")
API_S = struct.Struct("<qqQQQIIIi")
SYNC_S = struct.Struct("<qqQ6I")
RANGE_S = struct.Struct("<qqQQQqq6I")
assert (HELLO_S.size, WELCOME_S.size, ARM_S.size, STATUS_S.size, WINDOW_S.size, STEP_S.size,
        KERNEL_S.size, MEMCPY_S.size, MEMSET_S.size, API_S.size, SYNC_S.size,
        RANGE_S.size) == (816, 272, 48, 320, 104, 24, 88, 64, 56, 56, 48, 80)


def msg(mtype, payload=b"", count=0):
    return HDR.pack(MAGIC, VERSION, mtype, len(payload), count) + payload


def hello(job, rank, local_rank=0, world_size=1, device=0, step=-1, host="testhost"):
    return msg(HELLO, HELLO_S.pack(VERSION, os.getpid(), rank, local_rank, world_size, device,
                                   130001, 1, step, 0, job.encode(), host.encode(), b""))


def status(capture_id, state, step, records=0, dropped=0, cupti_dropped=0, overhead_ns=0,
           reason=""):
    return msg(STATUS, STATUS_S.pack(capture_id, state, 0, step, records, dropped, cupti_dropped,
                                     0, overhead_ns, reason.encode()))


def strings(table):
    """table: {id: text}"""
    body = b""
    for sid, text in table.items():
        b = text.encode()
        body += struct.pack("<II", sid, len(b)) + b + b"\0" * ((4 - len(b) % 4) % 4)
    return msg(STRINGS, body, len(table))


def records(kind, packed_list):
    size = len(packed_list[0])
    return msg(RECORDS, RECS_S.pack(kind, size) + b"".join(packed_list), len(packed_list))


def kernel(start, end, corr, name, device=0, stream=7, grid=(1, 1, 1), block=(128, 1, 1)):
    return KERNEL_S.pack(start, end, corr, 0, name, device, 1, stream, *grid, *block, 32, 0, 0, 0)


def memcpy(start, end, corr, nbytes, copy_kind=1, device=0, stream=7):
    return MEMCPY_S.pack(start, end, nbytes, corr, copy_kind, 1, 2, device, 1, stream, device,
                         device)


def api(start, end, corr, name, external_id=0, tid=1234, domain=1, cbid=211):
    return API_S.pack(start, end, corr, external_id, tid, domain, cbid, name, 0)


def range_(start, end, range_id, name, parent=0, tid=1234, seq=-1, op_id=-1, shapes=0, kind=1):
    return RANGE_S.pack(start, end, range_id, parent, tid, seq, op_id, name, 0, shapes, kind, 0, 0)


def window(mtype, capture_id, run_id, start, end, first_step, last_step, records_=0, dropped=0,
           cupti_dropped=0, overhead_ns=0):
    return msg(mtype, WINDOW_S.pack(capture_id, run_id, start, end, first_step, last_step,
                                    records_, dropped, cupti_dropped, 0, overhead_ns, start, 0))


def step(n, start):
    return msg(STEP, STEP_S.pack(n, start, 1, 0))


class Conn:
    """A SOCK_SEQPACKET connection to the agent."""

    def __init__(self, path, timeout=10.0):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.s.settimeout(timeout)
        self.s.connect(path)

    def send(self, data):
        self.s.send(data)

    def recv(self):
        """Returns (type, payload) or None if the agent closed the connection."""
        data = self.s.recv(MAX_MSG + 1)
        if not data:
            return None
        magic, ver, mtype, ln, _count = HDR.unpack_from(data)
        assert magic == MAGIC and ver == VERSION and ln == len(data) - HDR.size, data[:16]
        return mtype, data[HDR.size:]

    def closed(self, timeout=5.0):
        """True if the agent closes this connection within timeout (reading what comes)."""
        self.s.settimeout(timeout)
        try:
            while True:
                if not self.s.recv(MAX_MSG + 1):
                    return True
        except socket.timeout:
            return False
        except OSError:
            return True

    def close(self):
        self.s.close()


def parse_welcome(payload):
    accepted, _pad, agent_id, reason = WELCOME_S.unpack_from(payload)
    return accepted, reason.split(b"\0")[0].decode()


def parse_arm(payload):
    keys = ("capture_id", "run_id", "target_step", "n_steps", "activities", "duration_ms",
            "deadline_ns")
    return dict(zip(keys, ARM_S.unpack_from(payload)))
