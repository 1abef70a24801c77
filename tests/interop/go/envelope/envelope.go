// Package envelope is the pipeline.Job envelope in Go: the record, and its single-object encoding.
package envelope

import (
	"os"

	"github.com/hamba/avro/v2"
)

// AttemptError is one entry of a job's attempt history (pipeline.AttemptError).
type AttemptError struct {
	Attempt         int32   `avro:"attempt"`
	At              int64   `avro:"at"`
	ErrorClass      string  `avro:"error_class"`
	Message         string  `avro:"message"`
	Retryable       bool    `avro:"retryable"`
	TracebackDigest *string `avro:"traceback_digest"`
	Worker          *string `avro:"worker"`
}

// Job is the envelope record pipeline.Job v1; nullable fields are pointers.
type Job struct {
	ID              string            `avro:"id"`
	Type            string            `avro:"type"`
	Payload         []byte            `avro:"payload"`
	PayloadEncoding string            `avro:"payload_encoding"`
	Priority        string            `avro:"priority"`
	Attempt         int32             `avro:"attempt"`
	MaxAttempts     int32             `avro:"max_attempts"`
	CreatedAt       int64             `avro:"created_at"`
	NotBefore       *int64            `avro:"not_before"`
	IdempotencyKey  *string           `avro:"idempotency_key"`
	Tenant          *string           `avro:"tenant"`
	Headers         map[string]string `avro:"headers"`
	Errors          []AttemptError    `avro:"errors"`
}

// Encoder writes jobs in Avro single-object encoding: C3 01, fingerprint, body.
type Encoder struct {
	schema avro.Schema
	header []byte
}

// NewEncoder parses the job schema file once.
func NewEncoder(path string) (*Encoder, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	schema, err := avro.Parse(string(text))
	if err != nil {
		return nil, err
	}
	// CRC-64-AVRO of the Parsing Canonical Form, little-endian, as the spec's header wants.
	fingerprint, err := schema.FingerprintUsing(avro.CRC64AvroLE)
	if err != nil {
		return nil, err
	}
	return &Encoder{schema: schema, header: append([]byte{0xC3, 0x01}, fingerprint...)}, nil
}

// Encode returns the message value of job.
func (e *Encoder) Encode(job *Job) ([]byte, error) {
	body, err := avro.Marshal(e.schema, job)
	if err != nil {
		return nil, err
	}
	return append(append([]byte{}, e.header...), body...), nil
}
