import json,sys,collections,statistics
d=collections.defaultdict(lambda: collections.defaultdict(dict))
for l in open(sys.argv[1]):
    try: o=json.loads(l)
    except: continue
    x=o['x']; d[o['v']][(x['shape'],o['r'])][x['kernel']]=x['gflops']
for v,sh in d.items():
    ratios=collections.defaultdict(list)
    for (s,r),k in sh.items():
        if 'avx2' in k and 'gemm' in k: ratios[s].append(k['avx2']/k['gemm'])
    allr=[x for l in ratios.values() for x in l]
    print(v, 'median ratio %.3f'%statistics.median(allr), ' '.join('%s:%.2f'%(s.split('_1')[0] if False else s[:14],statistics.median(l)) for s,l in sorted(ratios.items())))
