# cpus.sh - sourced by the data-parallel benchmarks: allowed_cpus prints the CPUs this process
# may run on (its Cpus_allowed_list, such as "0-3,8"), one number per word in ascending order.
allowed_cpus() {
  awk '/^Cpus_allowed_list/ { n = split($2, p, ","); o = "";
    for (i = 1; i <= n; i++) { m = split(p[i], r, "-"); hi = m > 1 ? r[2] : r[1]; for (c = r[1]; c <= hi; c++) o = o " " c }
    print o }' /proc/self/status
}
