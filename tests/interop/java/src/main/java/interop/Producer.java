package interop;

import java.io.File;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;
import org.apache.avro.message.BinaryMessageEncoder;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.clients.producer.RoundRobinPartitioner;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Enqueues pipeline jobs from Java. Arguments: bootstrap servers, namespace, schema file, then the
 * counts of immediate, keyed, idempotency-keyed and delayed jobs, and the delay in milliseconds.
 * Prints one tab-separated line per job: id, kind, key, text.
 */
public class Producer {
    public static void main(String[] args) throws Exception {
        String servers = args[0];
        String ns = args[1];
        Schema schema = new Schema.Parser().parse(new File(args[2]));
        int immediate = Integer.parseInt(args[3]);
        int keyed = Integer.parseInt(args[4]);
        int idempotent = Integer.parseInt(args[5]);
        int delayed = Integer.parseInt(args[6]);
        long delayMs = Long.parseLong(args[7]);

        // Single-object encoding: C3 01 + fingerprint + body. Create the encoder once.
        BinaryMessageEncoder<GenericRecord> encoder =
            new BinaryMessageEncoder<>(GenericData.get(), schema);
        Schema encoding = schema.getField("payload_encoding").schema();

        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, servers);
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        // Keyed jobs: the default partitioner, murmur2 of the key. Unkeyed jobs: the default sticks
        // a burst to one partition, so they go through a producer that partitions round-robin
        // (RoundRobinPartitioner ignores keys: never use it for keyed jobs).
        Properties spreadProps = new Properties();
        spreadProps.putAll(props);
        spreadProps.put(ProducerConfig.PARTITIONER_CLASS_CONFIG, RoundRobinPartitioner.class.getName());

        List<String> lines = new ArrayList<>();
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<String, byte[]> keyedProducer = new KafkaProducer<>(props);
             KafkaProducer<String, byte[]> spreadProducer = new KafkaProducer<>(spreadProps)) {
            int total = immediate + keyed + idempotent + delayed;
            for (int n = 0; n < total; n++) {
                String kind;
                int i;
                if (n < immediate) {
                    kind = "immediate"; i = n;
                } else if (n < immediate + keyed) {
                    kind = "keyed"; i = n - immediate;
                } else if (n < immediate + keyed + idempotent) {
                    kind = "idempotent"; i = n - immediate - keyed;
                } else {
                    kind = "delayed"; i = n - immediate - keyed - idempotent;
                }
                long now = System.currentTimeMillis();
                String id = "java-" + kind + "-" + i + "-" + now;
                String text = "Grüße, 世界 🚀 java " + kind + " " + i;
                String key = switch (kind) {
                    case "keyed" -> "customer-" + i + "-ü";
                    case "idempotent" -> "order-" + i + "-" + System.nanoTime() + "-€";
                    case "delayed" -> "reminder-" + i;
                    default -> null;
                };
                String priority = kind.equals("delayed") ? "high" : "default";
                GenericRecordBuilder job = new GenericRecordBuilder(schema)
                    .set("id", id)
                    .set("type", "interop.echo")
                    .set("payload", ByteBuffer.wrap(
                        ("{\"text\":\"" + text + "\",\"n\":" + i + "}").getBytes(StandardCharsets.UTF_8)))
                    .set("payload_encoding", new GenericData.EnumSymbol(encoding, "JSON"))
                    .set("priority", priority)
                    .set("created_at", now)
                    .set("headers", Map.of("source", "java", "greeting", "Grüße"));
                if (kind.equals("idempotent")) {
                    job.set("idempotency_key", key);
                }
                String topic = ns + ".jobs." + priority;
                if (kind.equals("delayed")) {
                    // Due later: to <ns>.deferred, with its key; the scheduler releases it to
                    // <ns>.jobs.<priority> with the same key.
                    job.set("not_before", now + delayMs);
                    topic = ns + ".deferred";
                }
                ByteBuffer encoded = encoder.encode(job.build());
                byte[] value = new byte[encoded.remaining()];
                encoded.get(value);
                KafkaProducer<String, byte[]> producer = key == null ? spreadProducer : keyedProducer;
                sent.add(producer.send(new ProducerRecord<>(topic, key, value)));
                lines.add(id + "\t" + kind + "\t" + (key == null ? "" : key) + "\t" + text);
            }
            for (Future<RecordMetadata> result : sent) {
                result.get();
            }
        }
        java.io.PrintStream out = new java.io.PrintStream(System.out, true, StandardCharsets.UTF_8);
        lines.forEach(out::println);
    }
}
