package llmroute

import (
	"slices"
	"sync"
	"time"
)

// The registry lists the handler instances of the running config(s), so the
// admin API can report on every model and upstream whatever route or server
// a handler sits in. A handler joins when its config has started (not when
// it is provisioned: Caddy provisions configs it then throws away) and
// leaves in Cleanup. During a reload the old and the new instance are both
// listed for a moment; readers prefer the newest.
var registry struct {
	mu      sync.Mutex
	entries []registryEntry // in start order, oldest first
}

type registryEntry struct {
	h     *Handler
	since time.Time // when its config started
}

// registerHandler adds a started handler instance.
func registerHandler(h *Handler) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if slices.ContainsFunc(registry.entries, func(e registryEntry) bool { return e.h == h }) {
		return
	}
	registry.entries = append(registry.entries, registryEntry{h: h, since: time.Now()})
}

// unregisterHandler removes a handler instance that is being cleaned up.
func unregisterHandler(h *Handler) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	registry.entries = slices.DeleteFunc(registry.entries, func(e registryEntry) bool { return e.h == h })
}

// liveHandlers returns the registered instances, newest first.
func liveHandlers() []registryEntry {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	out := slices.Clone(registry.entries)
	slices.Reverse(out)
	return out
}
