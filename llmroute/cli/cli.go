// Package cli adds `caddy llm-route status` and `caddy llm-route explain` to
// the caddy command. Both read the admin API of a running Caddy
// (admin.api.llm_route) and print aligned tables; they never change state.
//
// It decodes the admin answers into its own types rather than importing the
// handler's: the JSON is the contract, and the command must also work
// against a Caddy built from another version of the module.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/caddyserver/caddy/v2"
	caddycmd "github.com/caddyserver/caddy/v2/cmd"
	"github.com/spf13/cobra"
)

func init() {
	caddycmd.RegisterCommand(caddycmd.Command{
		Name:  "llm-route",
		Usage: "status [--watch [--interval <d>] [--frames <n>]] | explain <model> [--tokens <n>] [--api <api>] [--session <key>] [--effort <e>] [--attr <name>=<value>]... [--address <admin>] [--config <path> [--adapter <name>]]",
		Short: "Shows the llm_route router's live state from the admin API",
		Long: `
Reads the llm_route admin API (GET /llm_route/status and /llm_route/explain)
of a running Caddy and prints tables.

  caddy llm-route status [--watch [--interval 2s]]
      every upstream (slots in use / limit, cooling and why, fail streak,
      probes), every model (its upstreams in order, queue) and provider;
      --watch redraws them with the last 15 minutes as sparklines
      (GET /llm_route/history) until Ctrl-C.

  caddy llm-route explain <model> [--tokens <n>]
      where a request for <model> would go right now, and why each upstream
      would or would not take it. Nothing is claimed.

  caddy llm-route explain auto --effort high --attr language=es
      for a router model (rules): the rule a request with that effort and
      those attributes would match, its chain, and where it would go.
      --attr is repeatable; --attr user=<id> or key=<key id> shows a
      weighted rule's choice for that user or client key.

The admin address is --address, else the admin listen address of --config,
else Caddy's default (localhost:2019, or CADDY_ADMIN). The command exits
non-zero when the admin API is off or cannot be reached.
`,
		CobraFunc: func(cmd *cobra.Command) {
			cmd.PersistentFlags().String("address", "", "The address of the admin API, if not the default")
			cmd.PersistentFlags().StringP("config", "c", "", "Configuration file to read the admin address from, if --address is not used")
			cmd.PersistentFlags().StringP("adapter", "a", "", "Name of the config adapter to apply (when --config is used)")
			cmd.SilenceUsage = true // runtime errors are not usage errors

			status := &cobra.Command{
				Use:   "status",
				Short: "Prints every upstream, model and provider with its live state",
				Args:  cobra.NoArgs,
				RunE: func(c *cobra.Command, _ []string) error {
					addr, err := adminAddress(c)
					if err != nil {
						return err
					}
					if watch, _ := c.Flags().GetBool("watch"); watch {
						interval, _ := c.Flags().GetDuration("interval")
						frames, _ := c.Flags().GetInt("frames")
						ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
						defer stop()
						return Watch(ctx, c.OutOrStdout(), addr, interval, frames)
					}
					return Status(c.OutOrStdout(), addr)
				},
			}
			status.Flags().Bool("watch", false, "Redraw the tables and the last 15 minutes' sparklines until Ctrl-C")
			status.Flags().Duration("interval", 2*time.Second, "How often --watch redraws")
			status.Flags().Int("frames", 0, "With --watch, stop after this many frames (0: until Ctrl-C)")
			explain := &cobra.Command{
				Use:   "explain <model>",
				Short: "Explains where a request for the model would go now",
				Args:  cobra.ExactArgs(1),
				RunE: func(c *cobra.Command, args []string) error {
					addr, err := adminAddress(c)
					if err != nil {
						return err
					}
					a := ExplainArgs{Model: args[0]}
					a.Tokens, _ = c.Flags().GetInt64("tokens")
					a.API, _ = c.Flags().GetString("api")
					a.Session, _ = c.Flags().GetString("session")
					a.Effort, _ = c.Flags().GetString("effort")
					a.Attrs, _ = c.Flags().GetStringArray("attr")
					return Explain(c.OutOrStdout(), addr, a)
				},
			}
			explain.Flags().Int64("tokens", -1, "Estimated request size in tokens (prompt plus max_tokens)")
			explain.Flags().String("api", "", "The client's API: chat (default), messages, responses, embeddings, completions")
			explain.Flags().String("session", "", "An affinity key (a client's session id): pools rank their members for it")
			explain.Flags().String("effort", "", "A router model request's effort: low, medium or high")
			explain.Flags().StringArray("attr", nil, "A router model request's attribute, name=value (repeatable)")
			cmd.AddCommand(status, explain)
			cmd.AddCommand(planCommand())
		},
	})
}

// adminAddress resolves --address, --config's admin listener, or the
// default, and refuses a config whose admin API is off.
func adminAddress(c *cobra.Command) (string, error) {
	address, _ := c.Flags().GetString("address")
	configFile, _ := c.Flags().GetString("config")
	adapter, _ := c.Flags().GetString("adapter")
	if address == "" && configFile != "" {
		cfg, _, _, err := caddycmd.LoadConfig(configFile, adapter)
		if err != nil {
			return "", err
		}
		var admin struct {
			Admin caddy.AdminConfig `json:"admin"`
		}
		if err := json.Unmarshal(cfg, &admin); err != nil {
			return "", fmt.Errorf("reading the admin settings of %s: %v", configFile, err)
		}
		if admin.Admin.Disabled {
			return "", fmt.Errorf("the admin API is disabled in %s (admin off), so there is no llm_route status to read", configFile)
		}
	}
	return caddycmd.DetermineAdminAPIAddress(address, nil, configFile, adapter)
}

// The admin answers, as far as the tables need them.
type status struct {
	Upstreams []struct {
		ID             string  `json:"id"`
		Provider       string  `json:"provider"`
		Model          string  `json:"model"`
		Inflight       int64   `json:"inflight"`
		Limit          *int64  `json:"limit"`
		CoolingSeconds float64 `json:"cooling_seconds"`
		CoolingReason  *string `json:"cooling_reason"`
		FailStreak     int64   `json:"fail_streak"`
		Draining       bool    `json:"draining"`
		Probes         *probes `json:"probes"`
		LastFailureAt  *string `json:"last_failure_at"`
	} `json:"upstreams"`
	Providers []struct {
		ID       string `json:"id"`
		Inflight int64  `json:"inflight"`
		Capacity *int64 `json:"capacity"`
	} `json:"providers"`
	Models []struct {
		Name       string   `json:"name"`
		Upstreams  []string `json:"upstreams"`
		QueueDepth int      `json:"queue_depth"`
		QueueSize  int      `json:"queue_size"`
	} `json:"models"`
	Sessions       int     `json:"sessions"`
	ConfigLoadedAt *string `json:"config_loaded_at"`
}

type probes struct {
	OK   int64 `json:"ok"`
	Fail int64 `json:"fail"`
}

type explanation struct {
	Model     string       `json:"model"`
	API       string       `json:"api"`
	Choice    *string      `json:"choice"`
	Outcome   string       `json:"outcome"`
	Affinity  string       `json:"affinity"`
	Rule      *ruleVerdict `json:"rule"`
	Upstreams []struct {
		ID        string `json:"id"`
		Verdict   string `json:"verdict"`
		Detail    string `json:"detail"`
		Placement *struct {
			Pool   string `json:"pool"`
			Rank   int    `json:"rank"`
			Reason string `json:"reason"`
		} `json:"placement"`
	} `json:"upstreams"`
}

// ruleVerdict is a router model's rule in an explanation.
type ruleVerdict struct {
	Name         string            `json:"name"`
	Priority     int               `json:"priority"`
	Effort       string            `json:"effort"`
	EffortSource string            `json:"effort_source"`
	Judge        string            `json:"judge"`
	Attributes   map[string]string `json:"attributes"`
	Unused       []string          `json:"unused_attributes"`
	Chain        []string          `json:"chain"`
	Weighted     *struct {
		First string `json:"first"`
		By    string `json:"by"`
		Key   string `json:"key"`
	} `json:"weighted"`
	NotAllowed string `json:"not_allowed"`
}

// print writes the rule's lines above the upstream table:
//
//	rule spanish-high (priority 30), effort high (explain), chain gemini-pro → gpt-4o
//	attributes: language=es
func (r *ruleVerdict) print(out io.Writer, model string) error {
	var b strings.Builder
	fmt.Fprintf(&b, "rule %s (priority %d), effort %s (%s), chain %s\n", r.Name, r.Priority, r.Effort, r.EffortSource,
		strings.Join(r.Chain, " → "))
	if len(r.Attributes) > 0 {
		names := make([]string, 0, len(r.Attributes))
		for n := range r.Attributes {
			names = append(names, n)
		}
		sort.Strings(names)
		for i, n := range names {
			names[i] = n + "=" + r.Attributes[n]
		}
		fmt.Fprintf(&b, "attributes: %s\n", strings.Join(names, " "))
	}
	for _, n := range r.Unused {
		fmt.Fprintf(&b, "attribute %s: no rule of %s reads it\n", n, model)
	}
	if w := r.Weighted; w != nil {
		if w.By == "none" {
			b.WriteString("weighted: no user, client key or session, so the first model is drawn per request\n")
		} else {
			fmt.Fprintf(&b, "weighted: first model %s for %s %s (the same every time)\n", w.First, w.By, w.Key)
		}
	}
	if r.Judge != "" {
		fmt.Fprintf(&b, "judge %s: a request without an effort would ask it; explain says medium\n", r.Judge)
	}
	_, err := io.WriteString(out, b.String())
	return err
}

// Status prints the status tables of the Caddy whose admin API is at addr.
func Status(out io.Writer, addr string) error {
	var s status
	if err := get(addr, "/llm_route/status", &s); err != nil {
		return err
	}
	if len(s.Upstreams) == 0 && len(s.Models) == 0 {
		_, err := fmt.Fprintln(out, "no llm_route handler is running")
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "UPSTREAM\tPROVIDER\tMODEL\tSLOTS\tCOOLING\tFAIL STREAK\tPROBES OK/FAIL\tSTATE")
	for _, u := range s.Upstreams {
		limit := "∞"
		if u.Limit != nil {
			limit = strconv.FormatInt(*u.Limit, 10)
		}
		cooling := "-"
		if u.CoolingReason != nil {
			cooling = strconv.Itoa(int(math.Ceil(u.CoolingSeconds))) + "s (" + *u.CoolingReason + ")"
		}
		probe := "-"
		if u.Probes != nil {
			probe = fmt.Sprintf("%d/%d", u.Probes.OK, u.Probes.Fail)
		}
		state := "serving"
		switch {
		case u.Draining:
			state = "draining"
		case u.CoolingReason != nil:
			state = "cooling"
		case u.Limit != nil && u.Inflight >= *u.Limit:
			state = "full"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%s\t%s\t%d\t%s\t%s\n",
			u.ID, u.Provider, dash(u.Model), u.Inflight, limit, cooling, u.FailStreak, probe, state)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "MODEL\tUPSTREAMS (IN ORDER)\tQUEUE")
	for _, m := range s.Models {
		queue := "no queue"
		if m.QueueSize > 0 {
			queue = fmt.Sprintf("%d/%d waiting", m.QueueDepth, m.QueueSize)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", m.Name, strings.Join(m.Upstreams, " → "), queue)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "PROVIDER\tIN FLIGHT\tCAPACITY")
	for _, p := range s.Providers {
		capacity := "-"
		if p.Capacity != nil {
			capacity = strconv.FormatInt(*p.Capacity, 10)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\n", p.ID, p.Inflight, capacity)
	}
	fmt.Fprintln(tw)
	loaded := "-"
	if s.ConfigLoadedAt != nil {
		loaded = *s.ConfigLoadedAt
		if t, err := time.Parse(time.RFC3339Nano, loaded); err == nil {
			loaded = t.UTC().Format(time.RFC3339)
		}
	}
	fmt.Fprintf(tw, "sessions %d, config loaded %s\n", s.Sessions, loaded)
	return tw.Flush()
}

// ExplainArgs are what `caddy llm-route explain` asks about. Tokens < 0
// and empty strings mean not given.
type ExplainArgs struct {
	Model, API, Session string
	Tokens              int64
	// Effort and Attrs (name=value) describe a router model's request.
	Effort string
	Attrs  []string
}

// Explain prints where a request for the model would go now. A pool
// member's line adds its place in the pool's ranking and why; a router
// model's answer starts with the rule that matches and its chain.
func Explain(out io.Writer, addr string, a ExplainArgs) error {
	q := url.Values{"model": {a.Model}}
	if a.Session != "" {
		q.Set("session", a.Session)
	}
	if a.Tokens >= 0 {
		q.Set("tokens", strconv.FormatInt(a.Tokens, 10))
	}
	if a.API != "" {
		q.Set("api", a.API)
	}
	if a.Effort != "" {
		q.Set("effort", a.Effort)
	}
	for _, at := range a.Attrs {
		q.Add("attr", at)
	}
	var e explanation
	if err := get(addr, "/llm_route/explain?"+q.Encode(), &e); err != nil {
		return err
	}
	if r := e.Rule; r != nil {
		if err := r.print(out, e.Model); err != nil {
			return err
		}
	}
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tUPSTREAM\tVERDICT\tDETAIL")
	for i, u := range e.Upstreams {
		mark := ""
		if e.Choice != nil && *e.Choice == u.ID {
			mark = "  ←"
		}
		detail := u.Detail
		if pl := u.Placement; pl != nil {
			detail += fmt.Sprintf(" [pool %s #%d: %s]", pl.Pool, pl.Rank, pl.Reason)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s%s\n", i+1, u.ID, u.Verdict, detail, mark)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	var verdict string
	switch e.Outcome {
	case "upstream":
		verdict = "a request for " + e.Model + " would go to " + *e.Choice
	case "queue":
		verdict = "a request for " + e.Model + " would wait in the queue for a slot"
	case "cooling":
		verdict = "a request for " + e.Model + " would get 503: every upstream is cooling"
	case "api_not_served":
		verdict = "a request for " + e.Model + " would get 503: no upstream serves " + e.API
	case "model_not_allowed":
		verdict = "a request for " + e.Model + " with that client key would get 403"
		if e.Rule != nil {
			verdict += ": " + e.Rule.NotAllowed
		}
	default:
		verdict = "a request for " + e.Model + " would get 503: every upstream is busy"
	}
	if e.Affinity != "" {
		verdict += " (affinity key " + e.Affinity + ")"
	}
	_, err := fmt.Fprintln(out, verdict)
	return err
}

// get reads one admin answer into v.
func get(addr, uri string, v any) error {
	resp, err := caddycmd.AdminAPIRequest(addr, http.MethodGet, uri, nil, nil)
	if err != nil {
		return describe(addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("reading the admin API's answer: %v", err)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("the admin API at %s did not answer llm_route JSON (is this Caddy built with llm_route?): %v", addr, err)
	}
	return nil
}

// describe turns an admin request error into what the user should know.
func describe(addr string, err error) error {
	msg := err.Error()
	var apiErr struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	switch {
	case strings.Contains(msg, "HTTP 404") && strings.Contains(msg, "model_not_found") || strings.Contains(msg, "HTTP 400"):
		// The router's own refusal (unknown model, a bad effort or attr):
		// its message says it all.
		if i := strings.Index(msg, "{"); i >= 0 && json.Unmarshal([]byte(msg[i:]), &apiErr) == nil && apiErr.Error.Message != "" {
			return errors.New(apiErr.Error.Message)
		}
	case strings.Contains(msg, "HTTP 404"):
		return fmt.Errorf("the admin API at %s has no /llm_route/ endpoints: this Caddy is not built with llm_route", addr)
	case strings.Contains(msg, "performing request"):
		return fmt.Errorf("cannot reach Caddy's admin API at %s (is Caddy running, with the admin API on? use --address to point elsewhere): %v", addr, err)
	}
	return err
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
