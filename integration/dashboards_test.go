package integration

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

var metricName = regexp.MustCompile(`llm_proxy_[a-z_]+`)

// baseMetric strips the series suffixes of a histogram.
func baseMetric(name string) string {
	for _, s := range []string{"_bucket", "_count", "_sum"} {
		if b, ok := strings.CutSuffix(name, s); ok && strings.HasSuffix(b, "_seconds") {
			return b
		}
	}
	return name
}

// TestDashboardAndAlertsMetricsExist: every llm_proxy_* metric that the
// example Grafana dashboard's queries and the example alert rules use is
// in a live /metrics scrape after some traffic.
func TestDashboardAndAlertsMetricsExist(t *testing.T) {
	raw, err := os.ReadFile("../examples/grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	used := map[string]string{}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, n := range metricName.FindAllString(tg.Expr, -1) {
				used[baseMetric(n)] = "dashboard panel " + p.Title
			}
		}
	}
	alerts, err := os.ReadFile("../examples/prometheus-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range metricName.FindAllString(string(alerts), -1) {
		used[baseMetric(n)] = "alert rules"
	}
	if len(used) < 8 {
		t.Fatalf("only %d metric names found in the examples: %v", len(used), used)
	}

	up := newUpstream(t, usageUpstream)
	cfg := basicConfig(up, 4)
	cfg["queue_size"] = 2 // the queue series exist for queued models
	p := startProxy(t, cfg)
	for _, stream := range []bool{false, true} {
		resp := p.chat(chatBody("m", stream))
		readAll(t, resp)
	}
	scrape := p.metrics()
	for name, where := range used {
		if !strings.Contains(scrape, "\n# TYPE "+name+" ") {
			t.Errorf("%s uses %s, which the live /metrics does not have", where, name)
		}
	}
}
