package llmroute

// embeddingsCodec is the embeddings front (POST …/embeddings): served only
// by upstreams that serve it natively, as sent (nativeOnly).
type embeddingsCodec struct{ nativeOnly }

func (embeddingsCodec) api() api { return apiEmbeddings }

// generates: an embeddings answer bills only its input.
func (embeddingsCodec) generates() bool { return false }
