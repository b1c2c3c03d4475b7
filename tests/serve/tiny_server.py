"""Script for the process-manager tests: a server that is slow, stubborn or broken on demand.

python tiny_server.py PORT [--delay S] [--exit N] [--child PIDFILE] [--ignore-term]
"""
import argparse
import http.server
import signal
import subprocess
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("port", type=int)
p.add_argument("--delay", type=float, default=0.0)  # seconds before listening
p.add_argument("--exit", type=int, default=None)  # die at start-up with this code
p.add_argument("--child", default=None)  # fork a worker that ignores SIGTERM; write its pid here
p.add_argument("--ignore-term", action="store_true")
args = p.parse_args()

print("starting", flush=True)
if args.exit is not None:
    print("fatal: out of memory (pretend)", flush=True)
    sys.exit(args.exit)
if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if args.child:
    child = subprocess.Popen([sys.executable, "-c",
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    with open(args.child, "w") as f:
        f.write(str(child.pid))
time.sleep(args.delay)


class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *a):
        pass


http.server.HTTPServer(("127.0.0.1", args.port), H).serve_forever()
