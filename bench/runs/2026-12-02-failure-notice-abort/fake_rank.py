"""Rank 1 of a two-rank torchrun-form job that never starts CUDA: it joins rank 0's store
(our server, Note [TCP store protocol]), arrives at the 'start' barrier, waits, then posts a
failure notice (Note [Failure notices]) the way a rank that threw would, and stays connected.
Used by run.sh (this folder) to see what rank 0, stuck waiting for its NCCL peer, does with the notice."""
import socket, struct, sys, time

port, wait_s = int(sys.argv[1]), float(sys.argv[2])
prefix = "fsdp/cuda/"
s = None
for _ in range(200):
    try:
        s = socket.create_connection(("127.0.0.1", port))
        break
    except OSError:
        time.sleep(0.05)
def string(x): return struct.pack("<Q", len(x)) + x.encode()
def send(b): s.sendall(b)
def add(key, delta):
    send(b"\x04" + string(key) + struct.pack("<q", delta))
    got = b""
    while len(got) < 8: got += s.recv(8 - len(got))
    return struct.unpack("<q", got)[0]
send(b"\x00" + struct.pack("<I", 0x3C85F7CE))
send(b"\x01" + string(prefix + "barrier/start/1") + string("1"))
print("fake rank 1: at the barrier, count", add(prefix + "barrier/start/count", 1), flush=True)
time.sleep(wait_s)
t = time.time()
if add(prefix + "fsdp/failure/count", 1) == 1:
    send(b"\x01" + string(prefix + "fsdp/failure/notice") + string("1\nrank 1 failed: simulated by fake_rank.py"))
print(f"fake rank 1: notice posted at {t:.3f}", flush=True)
time.sleep(30)
