// Package gemini translates between the Google Gemini API (generateContent,
// streamGenerateContent, the front Gemini CLI and the genai SDKs speak) and
// OpenAI chat completions. It is pure bytes → bytes, like wire/anthropic.
package gemini
