package llmroute

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		// ISO-8601
		{"PT30S", 30 * time.Second},
		{"PT1H15M", time.Hour + 15*time.Minute},
		{"PT0.5S", 500 * time.Millisecond},
		{"PT0,5S", 500 * time.Millisecond},
		{"PT500MS", 500 * time.Millisecond},
		{"PT1M30S", 90 * time.Second},
		{"PT15M", 15 * time.Minute},
		{"P1D", 24 * time.Hour},
		{"P1W", 7 * 24 * time.Hour},
		{"P1M", 720 * time.Hour},
		{"P1Y", 8760 * time.Hour},
		{"P1DT2H", 26 * time.Hour},
		{"P1Y2M3W4DT5H6M7S", (365+60+21+4)*24*time.Hour + 5*time.Hour + 6*time.Minute + 7*time.Second},
		{"P0.5D", 12 * time.Hour},
		{"pt30s", 30 * time.Second},
		{"p1d", 24 * time.Hour},
		{"PT0S", 0},
		{"P0D", 0},
		{"  PT1S  ", time.Second},
		// Go / Caddy
		{"30s", 30 * time.Second},
		{"1h15m", time.Hour + 15*time.Minute},
		{"1d", 24 * time.Hour},
		{"1.5h", 90 * time.Minute},
		{"500ms", 500 * time.Millisecond},
		{"0s", 0},
		{"0", 0},
		{"2d12h", 60 * time.Hour},
	} {
		got, err := ParseDuration(tc.in)
		if err != nil {
			t.Errorf("ParseDuration(%q): unexpected error %v", tc.in, err)
			continue
		}
		if got != tc.want {
			t.Errorf("ParseDuration(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestParseDurationErrors(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // substring of the error
	}{
		{"", "empty duration"},
		{"   ", "empty duration"},
		{"P", "invalid duration"},
		{"PT", "invalid duration"},
		{"P1H", "invalid duration"},   // H belongs to the time part
		{"PT1D", "invalid duration"},  // D belongs to the date part
		{"P1Y1Y", "invalid duration"}, // unit repeated
		{"P1D1Y", "invalid duration"}, // units out of order
		{"PT1M1H", "invalid duration"},
		{"PT1S1M", "invalid duration"},
		{"P1DT", "invalid duration"},
		{"PT1HT1M", "invalid duration"},
		{"PTS", "invalid duration"},
		{"P1", "invalid duration"},
		{"P1.2.3D", "invalid duration"},
		{"P-1D", "invalid duration"},
		{"P99999999999999999999Y", "invalid duration"},
		{"P300Y", "invalid duration"},                   // beyond time.Duration
		{"PT9223372036.854775808S", "invalid duration"}, // exactly 2^63 ns
		{"-1s", "must not be negative"},
		{"-1h30m", "must not be negative"},
		{"abc", "invalid duration"},
		{"10", "invalid duration"}, // a bare number other than 0 has no unit
		{"1x", "invalid duration"},
		{strings.Repeat("1", 1025) + "s", "too long"},
	} {
		got, err := ParseDuration(tc.in)
		if err == nil {
			t.Errorf("ParseDuration(%q) = %v, want an error", tc.in, got)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseDuration(%q) error %q does not contain %q", tc.in, err, tc.want)
		}
	}
}

func TestDurationUnmarshalJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{`1500000000`, 1500 * time.Millisecond},
		{`0`, 0},
		{`"30s"`, 30 * time.Second},
		{`"PT1H15M"`, 75 * time.Minute},
		{`"P1M"`, 720 * time.Hour},
		{`"1d"`, 24 * time.Hour},
		{`"720h"`, 720 * time.Hour},
	} {
		var d Duration
		if err := json.Unmarshal([]byte(tc.in), &d); err != nil {
			t.Errorf("unmarshal %s: %v", tc.in, err)
			continue
		}
		if time.Duration(d) != tc.want {
			t.Errorf("unmarshal %s = %v, want %v", tc.in, time.Duration(d), tc.want)
		}
	}
	for _, in := range []string{`-1`, `"-5s"`, `"soon"`, `""`, `1.5`, `true`, `{}`, `[]`, `"P1H"`} {
		var d Duration
		if err := json.Unmarshal([]byte(in), &d); err == nil {
			t.Errorf("unmarshal %s = %v, want an error", in, time.Duration(d))
		}
	}

	// In a struct, as the config uses it: absent stays nil.
	var cfg struct {
		A *Duration `json:"a,omitempty"`
		B *Duration `json:"b,omitempty"`
	}
	if err := json.Unmarshal([]byte(`{"a":"PT0S"}`), &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.A == nil || *cfg.A != 0 || cfg.B != nil {
		t.Errorf("got a=%v b=%v, want a=0s b=nil", cfg.A, cfg.B)
	}
}

func TestDurationMarshalJSON(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{720 * time.Hour, "720h"},
		{90 * time.Second, "1m30s"},
		{500 * time.Millisecond, "500ms"},
		{0, "0s"},
		{time.Hour, "1h"},
		{time.Minute, "1m"},
		{10 * time.Minute, "10m"},
		{75 * time.Minute, "1h15m"},
		{time.Hour + 5*time.Second, "1h0m5s"},
		{26 * time.Hour, "26h"},
		{1500 * time.Millisecond, "1.5s"},
		{time.Nanosecond, "1ns"},
	} {
		d := Duration(tc.in)
		if got := d.String(); got != tc.want {
			t.Errorf("Duration(%v).String() = %q, want %q", tc.in, got, tc.want)
		}
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != `"`+tc.want+`"` {
			t.Errorf("marshal %v = %s, want %q", tc.in, b, tc.want)
		}
		var back Duration
		if err := json.Unmarshal(b, &back); err != nil {
			t.Errorf("unmarshal %s: %v", b, err)
		} else if back != d {
			t.Errorf("round trip %v → %s → %v", tc.in, b, time.Duration(back))
		}
	}
}

// FuzzDuration: parsing never panics, never yields a negative value, and a
// parsed value survives MarshalJSON → UnmarshalJSON exactly.
func FuzzDuration(f *testing.F) {
	for _, seed := range []string{
		"PT30S", "PT1H15M", "PT0.5S", "PT500MS", "P1D", "P1W", "P1M", "P1Y", "P1DT2H",
		"pt30s", "30s", "1h15m", "1d", "1.5h", "0s", "PT0S", "", "P", "PT", "P1H", "PT1D",
		"-1s", "abc", "P1Y1Y", "PT1M1H", "P1,5D", "PT9223372036.854775807S", "2562047h47m16.854775807s",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDuration(s)
		if err != nil {
			return
		}
		if d < 0 {
			t.Fatalf("ParseDuration(%q) = %v, negative", s, d)
		}
		b, err := Duration(d).MarshalJSON()
		if err != nil {
			t.Fatalf("marshal %v: %v", d, err)
		}
		var back Duration
		if err := back.UnmarshalJSON(b); err != nil {
			t.Fatalf("ParseDuration(%q) = %v, marshals to %s, which does not parse: %v", s, d, b, err)
		}
		if time.Duration(back) != d {
			t.Fatalf("ParseDuration(%q) = %v, round trip through %s gives %v", s, d, b, time.Duration(back))
		}
	})
}
