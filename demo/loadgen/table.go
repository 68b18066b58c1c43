package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
)

// WriteTable prints the report as a Markdown table, one row per cell.
func WriteTable(w io.Writer, rep *Report) {
	fmt.Fprintln(w, "| store | transport | callers | mode | calls | failed | p50 | p99 | calls/s | CPU/call (v0m3) | CPU/call (redis) | CPU/call (stdio servers started) | p50 × direct |")
	fmt.Fprintln(w, "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	for _, c := range rep.Cells {
		fmt.Fprintf(w, "| %s | %s | %d | %s | %d | %s | %s | %s | %.0f | %s | %s | %s | %s |\n",
			c.Store, c.Transport, c.Callers, c.Mode, c.Calls, failed(c), msStr(c.P50Ms), msStr(c.P99Ms), c.CallsPerSec,
			cpuStr(c, c.CPUMsPerCall), redisStr(c), serverStr(c), ratioStr(c.RatioToDirect))
	}
	if fs := failureLines(rep.Cells); len(fs) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Failed calls by reason:")
		for _, l := range fs {
			fmt.Fprintln(w, "  "+l)
		}
	}
}

func failed(c Cell) string {
	if c.Failed == 0 {
		return "0"
	}
	return fmt.Sprintf("**%d**", c.Failed)
}

func failureLines(cells []Cell) []string {
	var out []string
	for _, c := range cells {
		for _, reason := range slices.Sorted(maps.Keys(c.Failures)) {
			out = append(out, fmt.Sprintf("%s: %d × %s", c.Key(), c.Failures[reason], reason))
		}
	}
	return out
}

func msStr(v float64) string {
	switch {
	case v == 0:
		return "–"
	case v < 10:
		return fmt.Sprintf("%.2f ms", v)
	case v < 100:
		return fmt.Sprintf("%.1f ms", v)
	default:
		return fmt.Sprintf("%.0f ms", v)
	}
}

func cpuStr(c Cell, v float64) string {
	if c.Mode != ModeGoverned {
		return "–"
	}
	return fmt.Sprintf("%.2f ms", v)
}

func redisStr(c Cell) string {
	if c.Mode != ModeGoverned || c.Store != StoreRedis {
		return "–"
	}
	return fmt.Sprintf("%.2f ms", c.RedisCPUMsPerCall)
}

func serverStr(c Cell) string {
	if c.Mode != ModeGoverned || c.Transport != TransportStdio {
		return "–"
	}
	return fmt.Sprintf("%.2f ms", c.ServerCPUMsPerCall)
}

func ratioStr(v float64) string {
	if v == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f×", v)
}

// WriteJSON writes the report as indented JSON.
func WriteJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// ReadReports reads and merges the JSON reports in files: their cells in
// order (a later cell with the same key is averaged with the earlier one,
// see merge).
func ReadReports(files []string) (*Report, error) {
	var reps []*Report
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("loadgen: %w", err)
		}
		var r Report
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("loadgen: %s: %w", f, err)
		}
		reps = append(reps, &r)
	}
	return merge(reps), nil
}

// merge joins reports: cells in first-seen order; a cell measured in more
// than one report sums its calls, failures and time, and takes the median
// of the percentiles and the mean of CPU per call, weighted by calls.
func merge(reps []*Report) *Report {
	out := &Report{}
	idx := map[string]int{}
	runs := map[string][]Cell{}
	for _, r := range reps {
		if out.Started.IsZero() || r.Started.Before(out.Started) {
			out.Started = r.Started
		}
		out.CPUs = r.CPUs
		out.Duration, out.CallsEach = r.Duration, r.CallsEach
		for _, c := range r.Cells {
			k := c.Key()
			if _, ok := idx[k]; !ok {
				idx[k] = len(out.Cells)
				out.Cells = append(out.Cells, c)
			}
			runs[k] = append(runs[k], c)
		}
	}
	for k, i := range idx {
		cs := runs[k]
		if len(cs) == 1 {
			continue
		}
		m := Cell{Store: cs[0].Store, Transport: cs[0].Transport, Callers: cs[0].Callers, Mode: cs[0].Mode}
		var p50, p99, ratio []float64
		var cpu, redis, server float64
		for _, c := range cs {
			m.Calls += c.Calls
			m.Failed += c.Failed
			m.Seconds += c.Seconds
			for r, n := range c.Failures {
				if m.Failures == nil {
					m.Failures = map[string]int{}
				}
				m.Failures[r] += n
			}
			p50, p99, ratio = append(p50, c.P50Ms), append(p99, c.P99Ms), append(ratio, c.RatioToDirect)
			all := float64(c.Calls + c.Failed)
			cpu += c.CPUMsPerCall * all
			redis += c.RedisCPUMsPerCall * all
			server += c.ServerCPUMsPerCall * all
		}
		if m.Seconds > 0 {
			m.CallsPerSec = float64(m.Calls) / m.Seconds
		}
		if all := float64(m.Calls + m.Failed); all > 0 {
			m.CPUMsPerCall, m.RedisCPUMsPerCall, m.ServerCPUMsPerCall = cpu/all, redis/all, server/all
		}
		m.P50Ms, m.P99Ms, m.RatioToDirect = median(p50), median(p99), median(ratio)
		out.Cells[i] = m
	}
	return out
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// WriteComparison prints before and after side by side as a Markdown
// table, with after/before ratios, for cells present in both.
func WriteComparison(w io.Writer, before, after *Report) {
	fmt.Fprintln(w, "| cell | p50 before | p50 after | × | p99 before | p99 after | × | calls/s before | calls/s after | × | CPU/call before | CPU/call after | × | p50 × direct before/after | failed before/after |")
	fmt.Fprintln(w, "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
	prev := map[string]Cell{}
	for _, c := range before.Cells {
		prev[c.Key()] = c
	}
	for _, a := range after.Cells {
		b, ok := prev[a.Key()]
		if !ok {
			continue
		}
		cpuB, cpuA, cpuX := "–", "–", "–"
		if a.Mode == ModeGoverned {
			cpuB, cpuA, cpuX = fmt.Sprintf("%.2f ms", b.CPUMsPerCall), fmt.Sprintf("%.2f ms", a.CPUMsPerCall), ratio(a.CPUMsPerCall, b.CPUMsPerCall)
		}
		toDirect := "–"
		if a.Mode == ModeGoverned {
			toDirect = ratioStr(b.RatioToDirect) + " → " + ratioStr(a.RatioToDirect)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %.0f | %.0f | %s | %s | %s | %s | %s | %d/%d |\n",
			a.Key(), msStr(b.P50Ms), msStr(a.P50Ms), ratio(a.P50Ms, b.P50Ms),
			msStr(b.P99Ms), msStr(a.P99Ms), ratio(a.P99Ms, b.P99Ms),
			b.CallsPerSec, a.CallsPerSec, ratio(a.CallsPerSec, b.CallsPerSec),
			cpuB, cpuA, cpuX, toDirect, b.Failed, a.Failed)
	}
	if fs := failureLines(after.Cells); len(fs) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "Failed calls after, by reason:")
		for _, l := range fs {
			fmt.Fprintln(w, "  "+l)
		}
	}
}

func ratio(after, before float64) string {
	if before == 0 || after == 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f", after/before)
}
