package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"

	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

// Exit statuses of `caddy llm-route plan`, for scripts and CI.
const (
	PlanNoChange = 0 // the candidate changes nothing in the router
	PlanChanges  = 1 // it changes something
	PlanInvalid  = 2 // it is invalid: loading it would fail
	PlanFailed   = 3 // the plan could not be asked (no admin API, …)
)

// planCommand is `caddy llm-route plan --config FILE [--adapter NAME]
// [--address ADMIN]`.
func planCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "plan --config <file> [--adapter <name>]",
		Short: "Prints what loading the config would change in the running router; applies nothing",
		Long: `
Sends the config (adapted like caddy reload does) to the running Caddy's
POST /llm_route/plan and prints what loading it would do: the providers,
upstreams, pools, models, keys and settings it adds, removes or changes
(secrets only as "changed"), and for each upstream whether its live state
carries over or which requests will drain. Nothing is applied.

Exit status: 0 no change, 1 changes, 2 the config is invalid (loading it
would fail), 3 the plan could not be asked.`,
		Args: cobra.NoArgs,
		RunE: func(c *cobra.Command, args []string) error {
			status, err := runPlan(c)
			// Caddy's wrapper turns a status above 1 into the process's
			// exit status (and logs err).
			return caddycmd.WrapCommandFuncForCobra(func(caddycmd.Flags) (int, error) { return status, err })(c, args)
		},
	}
}

func runPlan(c *cobra.Command) (int, error) {
	configFile, _ := c.Flags().GetString("config")
	adapter, _ := c.Flags().GetString("adapter")
	address, _ := c.Flags().GetString("address")
	if configFile == "" {
		return PlanFailed, errors.New("plan needs the candidate config: --config FILE")
	}
	cfg, _, _, err := caddycmd.LoadConfig(configFile, adapter)
	if err != nil {
		return PlanInvalid, err
	}
	addr, err := caddycmd.DetermineAdminAPIAddress(address, cfg, configFile, adapter)
	if err != nil {
		return PlanFailed, err
	}
	p, err := askPlan(addr, cfg)
	var invalid invalidConfig
	switch {
	case errors.As(err, &invalid):
		return PlanInvalid, err
	case err != nil:
		return PlanFailed, err
	}
	if printPlan(c.OutOrStdout(), p) {
		return PlanChanges, errors.New("the config changes the router (exit status 1)")
	}
	return PlanNoChange, nil
}

// invalidConfig is the running Caddy's refusal of the candidate.
type invalidConfig struct{ msg string }

func (e invalidConfig) Error() string { return "invalid config: " + e.msg }

// plan is the admin answer, as far as the printout needs it.
type plan struct {
	Handlers []struct {
		Path    string `json:"path"`
		Op      string `json:"op"`
		Changes []struct {
			Kind   string `json:"kind"`
			ID     string `json:"id"`
			Op     string `json:"op"`
			Note   string `json:"note"`
			Fields []struct {
				Path   string          `json:"path"`
				Old    json.RawMessage `json:"old"`
				New    json.RawMessage `json:"new"`
				Secret bool            `json:"secret"`
			} `json:"fields"`
		} `json:"changes"`
		State []struct {
			Upstream       string  `json:"upstream"`
			Op             string  `json:"op"`
			CarriesOver    bool    `json:"carries_over"`
			Inflight       int64   `json:"inflight"`
			CoolingSeconds float64 `json:"cooling_seconds"`
			Queued         int     `json:"queued"`
			Note           string  `json:"note"`
		} `json:"state"`
		Notes []string `json:"notes"`
	} `json:"handlers"`
	Valid bool `json:"valid"`
}

// askPlan posts the candidate to the admin API.
func askPlan(addr string, cfg []byte) (*plan, error) {
	resp, err := caddycmd.AdminAPIRequest(addr, http.MethodPost, "/llm_route/plan", nil, bytes.NewReader(cfg))
	if err != nil {
		msg := err.Error()
		if strings.Contains(msg, "HTTP 400") {
			var e struct {
				Error string `json:"error"`
			}
			if i := strings.Index(msg, "{"); i >= 0 && json.Unmarshal([]byte(msg[i:]), &e) == nil && e.Error != "" {
				return nil, invalidConfig{e.Error}
			}
		}
		if strings.Contains(msg, "HTTP 404") {
			return nil, fmt.Errorf("the admin API at %s has no /llm_route/plan: this Caddy is not built with an llm_route that plans", addr)
		}
		return nil, describe(addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("reading the admin API's answer: %v", err)
	}
	var p plan
	if err := json.Unmarshal(body, &p); err != nil || !p.Valid {
		return nil, fmt.Errorf("the admin API at %s did not answer a plan: %s", addr, strings.TrimSpace(string(body)))
	}
	return &p, nil
}

// printPlan prints the plan and reports whether it changes anything.
func printPlan(w io.Writer, p *plan) bool {
	changed := false
	for _, h := range p.Handlers {
		title := "llm_route at " + h.Path
		if h.Op != "" {
			title += " (" + h.Op + ")"
		}
		fmt.Fprintln(w, title)
		if h.Op != "" || len(h.Changes) > 0 {
			changed = true
		}
		if len(h.Changes) == 0 {
			fmt.Fprintln(w, "  no changes")
		}
		for _, c := range h.Changes {
			line := "  " + c.Kind
			if c.ID != "" {
				line += " " + c.ID
			}
			line += " " + c.Op
			if c.Note != "" {
				line += ": " + c.Note
			}
			fmt.Fprintln(w, line)
			for _, f := range c.Fields {
				if f.Secret {
					fmt.Fprintf(w, "      %s: changed (secret, not shown)\n", f.Path)
					continue
				}
				fmt.Fprintf(w, "      %s: %s → %s\n", f.Path, shown(f.Old), shown(f.New))
			}
		}
		for _, n := range h.Notes {
			fmt.Fprintln(w, "  note: "+n)
		}
		if len(h.State) > 0 {
			fmt.Fprintln(w)
			tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "  UPSTREAM\tPLAN\tCARRIES OVER\tIN FLIGHT\tCOOLING\tQUEUED\tNOTE")
			for _, s := range h.State {
				carry, cooling := "no", "-"
				if s.CarriesOver {
					carry = "yes"
				}
				if s.CoolingSeconds > 0 {
					cooling = strconv.Itoa(int(math.Ceil(s.CoolingSeconds))) + "s"
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%d\t%s\n", s.Upstream, s.Op, carry, s.Inflight, cooling, s.Queued, dash(s.Note))
			}
			_ = tw.Flush()
		}
		fmt.Fprintln(w)
	}
	if len(p.Handlers) == 0 {
		fmt.Fprintln(w, "no llm_route handler in either config")
	}
	if changed {
		fmt.Fprintln(w, "loading this config changes the router")
	} else {
		fmt.Fprintln(w, "loading this config changes nothing in the router")
	}
	return changed
}

// shown renders a field's JSON value, "none" when absent.
func shown(v json.RawMessage) string {
	if len(v) == 0 || string(v) == "null" {
		return "none"
	}
	return string(v)
}
