package cli

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// history is the part of GET /llm_route/history that --watch draws.
type history struct {
	Now           time.Time `json:"now"`
	BucketSeconds float64   `json:"bucket_seconds"`
	Upstreams     []struct {
		ID           string             `json:"id"`
		Limit        *int64             `json:"limit"`
		Requests     map[string][]int64 `json:"requests"`
		TTFTP95      []*float64         `json:"ttft_p95"`
		OutputTokens []int64            `json:"output_tokens"`
		Slots        []int64            `json:"slots"`
	} `json:"upstreams"`
	Keys []struct {
		ID            string   `json:"id"`
		SpendTodayUSD float64  `json:"spend_today_usd"`
		SpendMonthUSD float64  `json:"spend_month_usd"`
		SpendPerDay   *float64 `json:"spend_per_day"`
		SpendPerMonth *float64 `json:"spend_per_month"`
		TokensToday   int64    `json:"tokens_today"`
		TokensPerDay  *int64   `json:"tokens_per_day"`
		Served        []int64  `json:"served"`
		Failed        []int64  `json:"failed"`
	} `json:"keys"`
	Pools []struct {
		ID          string             `json:"id"`
		Placement   string             `json:"placement"`
		Placements  map[string][]int64 `json:"placements"`
		CachedRatio []*float64         `json:"cached_ratio"`
	} `json:"pools"`
}

// ANSI: clear the screen and home the cursor; red and reset for failures.
const (
	ansiClear = "\x1b[H\x1b[2J"
	ansiRed   = "\x1b[31m"
	ansiReset = "\x1b[0m"
)

// sparkCols is the width of a sparkline: 90 buckets, 3 to a column (30 s).
const sparkCols = 30

// Watch redraws the status tables and the last 15 minutes as sparklines
// every interval until ctx ends or, with frames > 0, after that many
// frames. A frame the admin API does not answer shows the error and the
// next one tries again.
func Watch(ctx context.Context, out io.Writer, addr string, interval time.Duration, frames int) error {
	if interval <= 0 {
		return fmt.Errorf("--interval must be positive, got %s", interval)
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for n := 1; ; n++ {
		var buf bytes.Buffer
		buf.WriteString(ansiClear)
		if err := Status(&buf, addr); err != nil {
			fmt.Fprintf(&buf, "%v\n", err)
		} else if err := drawHistory(&buf, addr); err != nil {
			fmt.Fprintf(&buf, "history: %v\n", err)
		}
		fmt.Fprintf(&buf, "\nevery %s · Ctrl-C ends\n", interval)
		if _, err := out.Write(buf.Bytes()); err != nil {
			return err
		}
		if frames > 0 && n >= frames {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// drawHistory prints the history answer as sparklines.
func drawHistory(out io.Writer, addr string) error {
	var h history
	if err := get(addr, "/llm_route/history", &h); err != nil {
		return err
	}
	secs := h.BucketSeconds
	if secs <= 0 {
		secs = 10
	}
	fmt.Fprintf(out, "\nLAST 15 MINUTES (%s per column, newest right)\n", time.Duration(3*secs)*time.Second)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "UPSTREAM\tOK/S (PEAK)\tFAILED\tTTFT P95 (MAX)\tTOKENS/S (PEAK)\tSLOTS (MAX)")
	for _, u := range h.Upstreams {
		ok := u.Requests["ok"]
		var failed []int64
		for res, s := range u.Requests {
			if res == "ok" || res == "cancelled" {
				continue
			}
			failed = addSeries(failed, s)
		}
		nFailed := sum(failed)
		fail := spark(columns(floats(failed), sumOf), 0) + " 0"
		if nFailed > 0 {
			fail = ansiRed + spark(columns(floats(failed), sumOf), 0) + " " + strconv.FormatInt(nFailed, 10) + ansiReset
		}
		ttft := make([]float64, len(u.TTFTP95))
		for i, v := range u.TTFTP95 {
			if v != nil {
				ttft[i] = *v
			}
		}
		slotsTop := 0.0
		if u.Limit != nil {
			slotsTop = float64(*u.Limit)
		}
		fmt.Fprintf(tw, "%s\t%s %s\t%s\t%s %s\t%s %s\t%s %s\n", u.ID,
			spark(columns(floats(ok), sumOf), 0), rate(maxOf(floats(ok)), secs),
			fail,
			spark(columns(ttft, maxOf), 0), seconds(maxOf(ttft)),
			spark(columns(floats(u.OutputTokens), sumOf), 0), rate(maxOf(floats(u.OutputTokens)), secs),
			spark(columns(floats(u.Slots), maxOf), slotsTop), strconv.FormatFloat(maxOf(floats(u.Slots)), 'f', -1, 64))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(h.Keys) > 0 {
		fmt.Fprintln(out)
		tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "KEY\tSPEND TODAY\tSPEND THIS MONTH\tTOKENS TODAY\tREQUESTS")
		for _, k := range h.Keys {
			served, failed := sum(k.Served), sum(k.Failed)
			req := strconv.FormatInt(served, 10) + " ok"
			if failed > 0 {
				req += ", " + ansiRed + strconv.FormatInt(failed, 10) + " failed" + ansiReset
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID,
				budgetBar(k.SpendTodayUSD, k.SpendPerDay, usd), budgetBar(k.SpendMonthUSD, k.SpendPerMonth, usd),
				budgetBar(float64(k.TokensToday), int64Ptr(k.TokensPerDay), func(v float64) string { return strconv.FormatInt(int64(v), 10) }),
				req)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(h.Pools) > 0 {
		fmt.Fprintln(out)
		tw = tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "POOL\tPLACEMENTS (15 MIN)\tCACHED")
		for _, p := range h.Pools {
			var parts []string
			for _, r := range []string{"first", "least_busy", "weighted", "pinned", "warm", "cold", "waited"} {
				if n := sum(p.Placements[r]); n > 0 {
					parts = append(parts, r+" "+strconv.FormatInt(n, 10))
				}
			}
			placed := strings.Join(parts, ", ")
			if placed == "" {
				placed = "none"
			}
			cached := make([]float64, len(p.CachedRatio))
			for i, v := range p.CachedRatio {
				if v != nil {
					cached[i] = *v
				}
			}
			fmt.Fprintf(tw, "%s (%s)\t%s\t%s\n", p.ID, p.Placement, placed, spark(columns(cached, maxOf), 1))
		}
		return tw.Flush()
	}
	return nil
}

// columns folds a series into sparkCols columns with f.
func columns(s []float64, f func([]float64) float64) []float64 {
	out := make([]float64, sparkCols)
	if len(s) == 0 {
		return out
	}
	per := (len(s) + sparkCols - 1) / sparkCols
	for c := range out {
		lo := c * per
		if lo >= len(s) {
			break
		}
		out[c] = f(s[lo:min(lo+per, len(s))])
	}
	return out
}

var blocks = []rune("▁▂▃▄▅▆▇█")

// spark draws values as block characters scaled to top (0: their
// maximum); zero is a dot.
func spark(v []float64, top float64) string {
	if top <= 0 {
		top = maxOf(v)
	}
	var b strings.Builder
	for _, x := range v {
		if x <= 0 || top <= 0 {
			b.WriteRune('·')
			continue
		}
		i := int(math.Ceil(x/top*float64(len(blocks)))) - 1
		b.WriteRune(blocks[max(0, min(i, len(blocks)-1))])
	}
	return b.String()
}

// budgetBar is "[####------] $0.21/$1", or the use alone without a limit.
func budgetBar(used float64, limit *float64, f func(float64) string) string {
	if limit == nil || *limit <= 0 {
		return f(used) + " (no limit)"
	}
	const width = 10
	n := int(math.Round(min(used / *limit, 1) * width))
	bar := "[" + strings.Repeat("#", n) + strings.Repeat("-", width-n) + "]"
	if used >= *limit {
		bar = ansiRed + bar + ansiReset
	}
	return bar + " " + f(used) + "/" + f(*limit)
}

func usd(v float64) string {
	return "$" + strconv.FormatFloat(math.Round(v*10000)/10000, 'f', -1, 64)
}

func int64Ptr(p *int64) *float64 {
	if p == nil {
		return nil
	}
	f := float64(*p)
	return &f
}

func floats(s []int64) []float64 {
	out := make([]float64, len(s))
	for i, v := range s {
		out[i] = float64(v)
	}
	return out
}

func addSeries(a, b []int64) []int64 {
	if a == nil {
		a = make([]int64, len(b))
	}
	for i := range min(len(a), len(b)) {
		a[i] += b[i]
	}
	return a
}

func sum(s []int64) int64 {
	var n int64
	for _, v := range s {
		n += v
	}
	return n
}

func sumOf(s []float64) float64 {
	var n float64
	for _, v := range s {
		n += v
	}
	return n
}

func maxOf(s []float64) float64 {
	var m float64
	for _, v := range s {
		m = max(m, v)
	}
	return m
}

func rate(v, secs float64) string {
	return strconv.FormatFloat(math.Round(v/secs*100)/100, 'f', -1, 64) + "/s"
}

func seconds(v float64) string {
	if v <= 0 {
		return "-"
	}
	return strconv.FormatFloat(v, 'f', -1, 64) + "s"
}
