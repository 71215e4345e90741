package llmroute

// completionsCodec is the legacy completions front (POST …/completions):
// served only by upstreams that serve it natively.
type completionsCodec struct{ nativeOnly }

func (completionsCodec) api() api { return apiCompletions }

func (completionsCodec) encode(ex *exchange, body []byte) ([]byte, endpoint, []byte, int) {
	return ex.encodeNative(body, epCompletions)
}
