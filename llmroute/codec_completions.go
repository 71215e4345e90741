package llmroute

// completionsCodec is the legacy completions front (POST …/completions):
// served only by upstreams that serve it natively, as sent (nativeOnly).
type completionsCodec struct{ nativeOnly }

func (completionsCodec) api() api { return apiCompletions }
