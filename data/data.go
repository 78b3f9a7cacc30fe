// Package data embeds the repository's sample data (see README.md here
// for each file's source and license), so that a command finds it from
// any working directory.
package data

import _ "embed"

// AzureConvTraceName is the path of the conversation trace in the
// repository.
const AzureConvTraceName = "data/AzureLLMInferenceTrace_conv.csv"

// AzureConvTrace is the content of AzureLLMInferenceTrace_conv.csv: one
// hour of a production LLM conversation service, one request per row
// (TIMESTAMP, ContextTokens, GeneratedTokens). It is shared: callers must
// not modify it.
//
//go:embed AzureLLMInferenceTrace_conv.csv
var AzureConvTrace []byte

// MooncakeSyntheticTraceName is the path of the Mooncake synthetic KV
// trace in the repository.
const MooncakeSyntheticTraceName = "data/mooncake_synthetic_trace.jsonl"

// MooncakeSyntheticTrace is the content of mooncake_synthetic_trace.jsonl:
// KV-cache block ids per request in Mooncake's JSON-lines format
// (hash_ids, input_length, output_length, timestamp). It is shared:
// callers must not modify it.
//
//go:embed mooncake_synthetic_trace.jsonl
var MooncakeSyntheticTrace []byte
