// Command registry writes jobs in the Confluent wire format with franz-go's schema registry
// client and serde (github.com/twmb/franz-go/pkg/sr) and hamba/avro. Built by the test suite.
//
// Arguments: bootstrap servers, the registry URL (Confluent API), namespace, the job.v1.avsc
// path, the invoice.avsc path, jobs of each kind. It writes "registry.envelope" jobs (a JSON
// payload) and "registry.invoice" jobs (a registry-framed acme.Invoice payload), both in
// registry-framed envelopes, and prints one line per job: <type> <id> <payload as run>.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"strconv"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"

	"github.com/pipeline/interop/envelope"
)

// Invoice is the acme.Invoice payload of registry.invoice jobs.
type Invoice struct {
	Number     string `avro:"number"`
	TotalCents int64  `avro:"total_cents"`
	Note       string `avro:"note"`
}

// register puts the schema in the file under subject and teaches serde to encode values of
// v's type with it, framed with the id the registry gave.
func register(ctx context.Context, client *sr.Client, serde *sr.Serde, subject, path string, v any) {
	text, err := os.ReadFile(path)
	if err != nil {
		log.Fatal(err)
	}
	schema, err := avro.Parse(string(text))
	if err != nil {
		log.Fatal(err)
	}
	created, err := client.CreateSchema(ctx, subject, sr.Schema{Schema: string(text), Type: sr.TypeAvro})
	if err != nil {
		log.Fatalf("registering %s: %v", subject, err)
	}
	serde.Register(created.ID, v,
		sr.EncodeFn(func(v any) ([]byte, error) { return avro.Marshal(schema, v) }),
		sr.DecodeFn(func(b []byte, v any) error { return avro.Unmarshal(schema, b, v) }))
}

func main() {
	if len(os.Args) != 7 {
		log.Fatalf("usage: %s SERVERS REGISTRY_URL NAMESPACE JOB_AVSC INVOICE_AVSC COUNT", os.Args[0])
	}
	servers, registryURL, namespace := os.Args[1], os.Args[2], os.Args[3]
	count, err := strconv.Atoi(os.Args[6])
	if err != nil {
		log.Fatal(err)
	}
	topic := namespace + ".jobs.default"
	ctx := context.Background()

	client, err := sr.NewClient(sr.URLs(registryURL))
	if err != nil {
		log.Fatal(err)
	}
	var serde sr.Serde
	register(ctx, client, &serde, topic+"-value", os.Args[4], envelope.Job{})
	register(ctx, client, &serde, "acme.Invoice-value", os.Args[5], Invoice{})

	producer, err := kgo.NewClient(kgo.SeedBrokers(servers), kgo.RequiredAcks(kgo.AllISRAcks()))
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()

	send := func(job envelope.Job, shown string) {
		value, err := serde.Encode(job)
		if err != nil {
			log.Fatal(err)
		}
		record := &kgo.Record{Topic: topic, Key: []byte(job.ID), Value: value}
		if err := producer.ProduceSync(ctx, record).FirstErr(); err != nil {
			log.Fatal(err)
		}
		fmt.Println(job.Type, job.ID, shown)
	}
	newJob := func(id, jobType, encoding string, payload []byte) envelope.Job {
		return envelope.Job{
			ID: id, Type: jobType, Payload: payload, PayloadEncoding: encoding,
			Priority: "default", Attempt: 1, MaxAttempts: 5, CreatedAt: time.Now().UnixMilli(),
			Headers: map[string]string{}, Errors: []envelope.AttemptError{},
		}
	}
	for i := 0; i < count; i++ {
		payload, err := json.Marshal(map[string]any{"greeting": "Grüße, 世界 🚀", "n": i})
		if err != nil {
			log.Fatal(err)
		}
		send(newJob(fmt.Sprintf("go-envelope-%d", i), "registry.envelope", "JSON", payload), string(payload))
	}
	for i := 0; i < count; i++ {
		invoice := Invoice{Number: fmt.Sprintf("GO-%d", i), TotalCents: int64(2000 + i), Note: "Grüße, 世界 🚀"}
		payload, err := serde.Encode(invoice)
		if err != nil {
			log.Fatal(err)
		}
		shown, err := json.Marshal(map[string]any{
			"number": invoice.Number, "total_cents": invoice.TotalCents, "note": invoice.Note,
		})
		if err != nil {
			log.Fatal(err)
		}
		send(newJob(fmt.Sprintf("go-invoice-%d", i), "registry.invoice", "AVRO", payload), string(shown))
	}
}
