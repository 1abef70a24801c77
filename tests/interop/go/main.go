// Command producer enqueues pipeline jobs from Go, with hamba/avro and franz-go, as
// docs/wire-format.md describes. It prints one JSON line per job: id, kind, key, text.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
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

// produced is what the test reads back from stdout.
type produced struct {
	ID   string `json:"id"`
	Kind string `json:"kind"`
	Key  string `json:"key"`
	Text string `json:"text"`
}

func main() {
	brokers := flag.String("brokers", "localhost:9092", "bootstrap servers")
	namespace := flag.String("namespace", "pipeline", "topic namespace")
	schemaPath := flag.String("schema", "schemas/pipeline/job.v1.avsc", "job schema file")
	immediate := flag.Int("immediate", 10, "unkeyed jobs")
	keyed := flag.Int("keyed", 10, "jobs with a business key")
	idempotent := flag.Int("idempotent", 10, "jobs with an idempotency key")
	delayed := flag.Int("delayed", 5, "jobs due later, written to <ns>.deferred")
	delay := flag.Duration("delay", 2*time.Second, "how far in the future delayed jobs are due")
	flag.Parse()

	encoder, err := NewEncoder(*schemaPath)
	if err != nil {
		log.Fatalf("job schema: %v", err)
	}
	// Keyed jobs: the default StickyKeyPartitioner hashes a key with Kafka's murmur2, as Java's
	// client and the Python library do. Unkeyed jobs: that partitioner sticks a burst to one
	// partition, so they go through a client that partitions round-robin (it ignores keys).
	common := []kgo.Opt{kgo.SeedBrokers(*brokers), kgo.RequiredAcks(kgo.AllISRAcks())}
	keyedClient, err := kgo.NewClient(common...)
	if err != nil {
		log.Fatalf("kafka client: %v", err)
	}
	defer keyedClient.Close()
	spreadClient, err := kgo.NewClient(append(common, kgo.RecordPartitioner(kgo.RoundRobinPartitioner()))...)
	if err != nil {
		log.Fatalf("kafka client: %v", err)
	}
	defer spreadClient.Close()

	var (
		keyedRecords, spreadRecords []*kgo.Record
		out                         []produced
	)
	add := func(kind string, i int, key string, idempotencyKey *string, notBefore *int64, priority string) {
		text := fmt.Sprintf("Grüße, 世界 🚀 go %s %d", kind, i)
		payload, err := json.Marshal(map[string]any{"text": text, "n": i})
		if err != nil {
			log.Fatalf("payload: %v", err)
		}
		now := time.Now().UnixMilli()
		job := &Job{
			ID:              fmt.Sprintf("go-%s-%d-%d", kind, i, now),
			Type:            "interop.echo",
			Payload:         payload,
			PayloadEncoding: "JSON",
			Priority:        priority,
			Attempt:         1,
			MaxAttempts:     5,
			CreatedAt:       now,
			NotBefore:       notBefore,
			IdempotencyKey:  idempotencyKey,
			Headers:         map[string]string{"source": "go", "greeting": "Grüße"},
			Errors:          []AttemptError{},
		}
		value, err := encoder.Encode(job)
		if err != nil {
			log.Fatalf("encode: %v", err)
		}
		topic := *namespace + ".jobs." + priority
		if notBefore != nil {
			topic = *namespace + ".deferred"
		}
		record := &kgo.Record{Topic: topic, Value: value}
		if key == "" {
			spreadRecords = append(spreadRecords, record)
		} else {
			record.Key = []byte(key)
			keyedRecords = append(keyedRecords, record)
		}
		out = append(out, produced{ID: job.ID, Kind: kind, Key: key, Text: text})
	}
	for i := 0; i < *immediate; i++ {
		add("immediate", i, "", nil, nil, "default")
	}
	for i := 0; i < *keyed; i++ {
		add("keyed", i, fmt.Sprintf("customer-%d-ü", i), nil, nil, "default")
	}
	for i := 0; i < *idempotent; i++ {
		key := fmt.Sprintf("order-%d-%d-€", i, time.Now().UnixNano())
		add("idempotent", i, key, &key, nil, "default")
	}
	for i := 0; i < *delayed; i++ {
		due := time.Now().Add(*delay).UnixMilli()
		// A delayed job keeps its key on <ns>.deferred: the scheduler releases it with that key.
		add("delayed", i, fmt.Sprintf("reminder-%d", i), nil, &due, "high")
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := keyedClient.ProduceSync(ctx, keyedRecords...).FirstErr(); err != nil {
		log.Fatalf("produce: %v", err)
	}
	if err := spreadClient.ProduceSync(ctx, spreadRecords...).FirstErr(); err != nil {
		log.Fatalf("produce: %v", err)
	}
	lines := json.NewEncoder(os.Stdout)
	for _, job := range out {
		if err := lines.Encode(job); err != nil {
			log.Fatalf("stdout: %v", err)
		}
	}
}
