package harness

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of the CPU times in /proc: fixed at 100 per second
// for user space on Linux, whatever the kernel's own tick.
const userHZ = 100

// CPU is a reading of the CPU time each process on the machine, and the
// machine as a whole, has used so far. Two readings tell what a phase of a
// measurement cost the shared cores, and who spent it.
type CPU struct {
	at         time.Time
	busy, idle float64
	procs      map[int]procCPU
}

type procCPU struct {
	group   string
	seconds float64
}

// ReadCPU reads /proc. self names the calling process's group (the load
// generator of a benchmark).
func ReadCPU(self string) CPU {
	c := CPU{at: time.Now(), procs: map[int]procCPU{}}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		for i := 1; i < len(f); i++ {
			v, _ := strconv.ParseFloat(f[i], 64)
			switch i {
			case 4, 5: // idle, iowait
				c.idle += v / userHZ
			case 1, 2, 3, 6, 7, 8: // user, nice, system, irq, softirq, steal
				c.busy += v / userHZ
			}
		}
	}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		b, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open {
			continue
		}
		f := strings.Fields(s[closing+1:])
		if len(f) < 13 {
			continue
		}
		utime, _ := strconv.ParseFloat(f[11], 64)
		stime, _ := strconv.ParseFloat(f[12], 64)
		group := groupOf(s[open+1 : closing])
		if pid == os.Getpid() {
			group = self
		}
		c.procs[pid] = procCPU{group: group, seconds: (utime + stime) / userHZ}
	}
	return c
}

// groupOf names the part of the system a process belongs to.
func groupOf(comm string) string {
	switch {
	case strings.HasPrefix(comm, "beam"), comm == "erl_child_setup", comm == "epmd":
		return "rabbitmq"
	case strings.HasPrefix(comm, "postgres"):
		return "postgres"
	case strings.HasPrefix(comm, "redis"):
		return "redis"
	case comm == "receiver", comm == "worker":
		return comm
	}
	return "other"
}

// Since says how many cores each group used on average between from and
// c, busiest first, and how much of the machine was idle, e.g.
// "rabbitmq 0.71, receiver 0.58, … idle 0.45 of 2 cores".
func (c CPU) Since(from CPU) string {
	wall := c.at.Sub(from.at).Seconds()
	if wall <= 0 {
		return "n/a"
	}
	used := map[string]float64{}
	for pid, p := range c.procs {
		before := 0.0
		if q, ok := from.procs[pid]; ok && q.group == p.group {
			before = q.seconds
		}
		used[p.group] += (p.seconds - before) / wall
	}
	groups := make([]string, 0, len(used))
	for g, v := range used {
		if v >= 0.01 {
			groups = append(groups, g)
		}
	}
	sort.Slice(groups, func(i, j int) bool { return used[groups[i]] > used[groups[j]] })
	var parts []string
	for _, g := range groups {
		parts = append(parts, fmt.Sprintf("%s %.2f", g, used[g]))
	}
	cores := (c.busy + c.idle - from.busy - from.idle) / wall
	return fmt.Sprintf("%s; idle %.2f of %.0f cores", strings.Join(parts, ", "), (c.idle-from.idle)/wall, cores)
}
