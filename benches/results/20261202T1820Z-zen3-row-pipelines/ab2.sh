#!/bin/bash
# usage: A=name B=name F=regex ab2.sh ; binaries /tmp/ops-$A /tmp/ops-$B
for r in 1 2 3; do for b in $A $B; do
  /tmp/ops-$b --bench "$F" --warm-up-time 1 --measurement-time 3 --noplot 2>&1 | awk -v b=$b -v r=$r '/^(memory_bound|attention)/{name=$1} /thrpt:/ && name!="" {print r, b, name, $4, $5; name=""}'
done; done
