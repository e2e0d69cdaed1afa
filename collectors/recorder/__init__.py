"""The real-fleet recorder: real PyTorch gloo jobs in network namespaces, captured at emulated
switches, written as a landing folder plus ground truth from the jobs' own logs (record.py)."""
