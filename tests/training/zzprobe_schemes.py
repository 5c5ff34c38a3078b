import subprocess, sys, os
def test_probe(sample_shards):
    extra = os.environ.get("PROBE_EXTRA", "").split()
    subprocess.run([sys.executable, "/tmp/ft2/schemes_probe.py", str(sample_shards[0]), str(sample_shards[1]), *extra], check=True)
