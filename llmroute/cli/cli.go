// Package cli adds `caddy llm-route status` and `caddy llm-route explain` to
// the caddy command. Both read the admin API of a running Caddy
// (admin.api.llm_route) and print aligned tables; they never change state.
//
// It decodes the admin answers into its own types rather than importing the
// handler's: the JSON is the contract, and the command must also work
// against a Caddy built from another version of the module.
package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
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
		Usage: "status | explain <model> [--tokens <n>] [--api <api>] [--address <admin>] [--config <path> [--adapter <name>]]",
		Short: "Shows the llm_route router's live state from the admin API",
		Long: `
Reads the llm_route admin API (GET /llm_route/status and /llm_route/explain)
of a running Caddy and prints tables.

  caddy llm-route status
      every upstream (slots in use / limit, cooling and why, fail streak,
      probes), every model (its upstreams in order, queue) and provider.

  caddy llm-route explain <model> [--tokens <n>]
      where a request for <model> would go right now, and why each upstream
      would or would not take it. Nothing is claimed.

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
					return Status(c.OutOrStdout(), addr)
				},
			}
			explain := &cobra.Command{
				Use:   "explain <model>",
				Short: "Explains where a request for the model would go now",
				Args:  cobra.ExactArgs(1),
				RunE: func(c *cobra.Command, args []string) error {
					addr, err := adminAddress(c)
					if err != nil {
						return err
					}
					tokens, _ := c.Flags().GetInt64("tokens")
					api, _ := c.Flags().GetString("api")
					session, _ := c.Flags().GetString("session")
					return Explain(c.OutOrStdout(), addr, args[0], tokens, api, session)
				},
			}
			explain.Flags().Int64("tokens", -1, "Estimated request size in tokens (prompt plus max_tokens)")
			explain.Flags().String("api", "", "The client's API: chat (default), messages, responses, embeddings, completions")
			explain.Flags().String("session", "", "An affinity key (a client's session id): pools rank their members for it")
			cmd.AddCommand(status, explain)
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
	Model     string  `json:"model"`
	API       string  `json:"api"`
	Choice    *string `json:"choice"`
	Outcome   string  `json:"outcome"`
	Affinity  string  `json:"affinity"`
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

// Explain prints where a request for model would go now. tokens < 0, api
// "" and session "" mean not given; a pool member's line adds its place in
// the pool's ranking and why.
func Explain(out io.Writer, addr, model string, tokens int64, api, session string) error {
	q := url.Values{"model": {model}}
	if session != "" {
		q.Set("session", session)
	}
	if tokens >= 0 {
		q.Set("tokens", strconv.FormatInt(tokens, 10))
	}
	if api != "" {
		q.Set("api", api)
	}
	var e explanation
	if err := get(addr, "/llm_route/explain?"+q.Encode(), &e); err != nil {
		return err
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
	case strings.Contains(msg, "HTTP 404") && strings.Contains(msg, "model_not_found"):
		if i := strings.Index(msg, "{"); i >= 0 && json.Unmarshal([]byte(msg[i:]), &apiErr) == nil {
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
