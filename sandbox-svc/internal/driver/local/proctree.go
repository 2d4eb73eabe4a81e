package local

import (
	"bytes"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// procStat is what killTree reads of a process: /proc/PID/stat's parent,
// process group and session (host pids, as this process's /proc shows them,
// also for processes in a sandbox's pid namespace).
type procStat struct {
	pid, ppid, pgid, sid int
	zombie               bool // ended, not yet reaped
}

// readProcs lists the host's processes. A process that ends while it is read
// is left out.
func readProcs() []procStat {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	procs := make([]procStat, 0, len(ents))
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if st, ok := parseStat(pid, data); ok {
			procs = append(procs, st)
		}
	}
	return procs
}

// parseStat reads "pid (comm) state ppid pgrp session ...": comm may hold
// spaces and parentheses, so the fields start after the last ")".
func parseStat(pid int, data []byte) (procStat, bool) {
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := bytes.Fields(data[i+1:])
	if len(f) < 4 {
		return procStat{}, false
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	pgid, err2 := strconv.Atoi(string(f[2]))
	sid, err3 := strconv.Atoi(string(f[3]))
	if err1 != nil || err2 != nil || err3 != nil {
		return procStat{}, false
	}
	return procStat{pid: pid, ppid: ppid, pgid: pgid, sid: sid, zombie: string(f[0]) == "Z"}, true
}

// killTree SIGKILLs root, every process descended from it and every process
// in a process group or session one of them is in (groups adds groups of
// its own): an interactive shell puts each background job (`sleep 1000 &`)
// in a group of its own, and what a killed parent leaves behind is
// re-parented but keeps its session. This process's own group and session
// are never touched. It repeats until a pass finds nothing left, a few
// passes at most (a process forking while it is killed).
func killTree(root int, groups []int) {
	self := os.Getpid()
	selfPgid, _ := unix.Getpgid(self)
	selfSid, _ := unix.Getsid(self)
	pgids := map[int]bool{}
	sids := map[int]bool{}
	for _, g := range groups {
		if g > 0 && g != selfPgid {
			pgids[g] = true
		}
	}
	for pass := 0; pass < 5; pass++ {
		procs := readProcs()
		children := map[int][]int{}
		byPid := map[int]procStat{}
		for _, p := range procs {
			children[p.ppid] = append(children[p.ppid], p.pid)
			byPid[p.pid] = p
		}
		// Descendants of root (root included while it is there).
		tree := map[int]bool{}
		queue := []int{root}
		for len(queue) > 0 {
			pid := queue[0]
			queue = queue[1:]
			if tree[pid] || pid == self {
				continue
			}
			if _, ok := byPid[pid]; !ok && pid != root {
				continue
			}
			tree[pid] = true
			queue = append(queue, children[pid]...)
		}
		for pid := range tree {
			if p, ok := byPid[pid]; ok {
				if p.pgid != selfPgid {
					pgids[p.pgid] = true
				}
				if p.sid != selfSid && p.sid > 0 {
					sids[p.sid] = true
				}
			}
		}
		var victims []int
		for _, p := range procs {
			if p.pid == self || p.pid == 1 || p.zombie {
				continue
			}
			if tree[p.pid] || pgids[p.pgid] || sids[p.sid] {
				victims = append(victims, p.pid)
			}
		}
		if len(victims) == 0 {
			return
		}
		for _, pid := range victims {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
