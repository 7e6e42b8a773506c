"""Summarises raw.txt (alternating criterion runs of two bench binaries): per op and
binary, the median time and the median ratio own-size copy / op (the "% of copy")."""
import re, statistics, collections
cur = None; t = collections.defaultdict(dict)
for line in open('raw.txt'):
    m = re.match(r'== round (\d+) (\S+) load (\S+)', line)
    if m: cur = (int(m[1]), m[2]); continue
    m = re.match(r'memory_bound/(\S+?)/(\S+)', line)
    if m: key = (m[1], m[2]); continue
    m = re.search(r'time:\s+\[\S+ \S+ (\S+) (µs|ms|ns)', line)
    if m and '%' not in line:
        v = float(m[1]) * {'ns': 1e-3, 'µs': 1, 'ms': 1e3}[m[2]]
        t[(cur[1], key[1])].setdefault(cur[0], {})[key[0]] = v
ops = sorted({k[1] for k in t}); bins = sorted({k[0] for k in t})
print('| op | binary | rounds | median op µs | median copy µs | median % of copy |')
print('|---|---|---|---|---|---|')
for op in ops:
    for b in bins:
        r = t[(b, op)]
        xs = [v['cpu-2t'] for v in r.values()]; cs = [v['copy-2t'] for v in r.values()]
        pc = [100 * v['copy-2t'] / v['cpu-2t'] for v in r.values()]
        print(f'| {op} | {b} | {len(xs)} | {statistics.median(xs):.1f} | {statistics.median(cs):.1f} | {statistics.median(pc):.1f}% |')
