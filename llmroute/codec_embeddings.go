package llmroute

// embeddingsCodec is the embeddings front (POST …/embeddings): served only
// by upstreams that serve it natively.
type embeddingsCodec struct{ nativeOnly }

func (embeddingsCodec) api() api { return apiEmbeddings }

func (embeddingsCodec) encode(ex *exchange, body []byte) ([]byte, endpoint, []byte, int) {
	return ex.encodeNative(body, epEmbeddings)
}
