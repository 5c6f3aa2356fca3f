import json, subprocess, sys, time, urllib.request
pkgs = sys.argv[1:]
srv = subprocess.Popen(["target/release/nmt-server", "--model-dir", ",".join(pkgs), "--port", "0", "--grpc-port", "0", "--max-input-tokens", "1000", "--max-texts-per-request", "1000"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
url = srv.stdout.readline().split()[-1]
while True:
    try:
        urllib.request.urlopen(url + "/ready"); break
    except Exception: time.sleep(0.1)
models = json.load(urllib.request.urlopen(url + "/models"))["models"]
for split in ["test12", "test20"]:
    src = open(f"/tmp/syn/corpus/{split}.en").read().split("\n")[:-1]
    for m in models:
        req = urllib.request.Request(url + "/translate", json.dumps({"text": src, "model": m["name"]}).encode(), {"content-type": "application/json"})
        try:
            out = [t["text"] for t in json.load(urllib.request.urlopen(req))["translations"]]
        except urllib.error.HTTPError as e:
            print(m["name"], split, e.read()); continue
        acc = sum(o.split() == s.split() for o, s in zip(out, src)) / len(src)
        pos = sum(sum(a == b for a, b in zip(o.split(), s.split())) for o, s in zip(out, src)) / sum(len(s.split()) for s in src)
        lens = sum(len(o.split()) for o in out) / len(out)
        print(f"{m['name']:28s} {split}: exact {acc:.2f}  per-position {pos:.2f}  mean output symbols {lens:.1f}")
srv.terminate(); srv.wait()
