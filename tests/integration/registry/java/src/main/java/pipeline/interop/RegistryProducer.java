package pipeline.interop;

import io.apicurio.registry.serde.SerdeConfig;
import io.apicurio.registry.serde.avro.AvroKafkaSerializer;
import java.io.File;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;
import java.util.Properties;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.generic.GenericRecordBuilder;
import org.apache.avro.message.BinaryMessageEncoder;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Produces jobs the way a Java service that already uses a schema registry would.
 *
 * <ul>
 *   <li>{@code registry.envelope} jobs: the whole {@code pipeline.Job} value written by the
 *       registry's serializer (the worker reads it with {@code schema_registry.url} set);
 *   <li>{@code registry.invoice} jobs: a single-object encoded envelope whose payload is an
 *       {@code acme.Invoice} written by the registry's serializer (a {@code
 *       RegistryAvroPayload} job type).
 * </ul>
 *
 * <p>Arguments: bootstrap servers, registry URL (Apicurio's native API, {@code .../apis/registry/v2}),
 * namespace, the {@code job.v1.avsc} path, the {@code invoice.avsc} path, jobs of each kind.
 * Prints one line per job: {@code <type> <id> <payload as the worker must see it>}.
 */
public final class RegistryProducer {
    private RegistryProducer() {}

    /** Apicurio's serializer, set to write the Confluent wire format with the ids in the value. */
    static Map<String, Object> serdeConfig(String registryUrl) {
        Map<String, Object> config = new HashMap<>();
        config.put(SerdeConfig.REGISTRY_URL, registryUrl);
        config.put(SerdeConfig.AUTO_REGISTER_ARTIFACT, true);
        config.put(SerdeConfig.ENABLE_CONFLUENT_ID_HANDLER, true); // 4-byte ids, as Confluent's
        config.put(SerdeConfig.ENABLE_HEADERS, false); // the id in the value, not a header
        return config;
    }

    public static void main(String[] args) throws Exception {
        String servers = args[0];
        String registryUrl = args[1];
        String namespace = args[2];
        Schema jobSchema = new Schema.Parser().parse(new File(args[3]));
        Schema invoiceSchema = new Schema.Parser().parse(new File(args[4]));
        int count = Integer.parseInt(args[5]);
        String topic = namespace + ".jobs.default";
        Schema encoding = jobSchema.getField("payload_encoding").schema();

        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, servers);
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());

        // 1. Envelopes written by the registry's serializer, with a JSON payload.
        Properties envelopeProps = new Properties();
        envelopeProps.putAll(props);
        envelopeProps.put(
            ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, AvroKafkaSerializer.class.getName());
        envelopeProps.putAll(serdeConfig(registryUrl));
        try (KafkaProducer<String, GenericRecord> producer = new KafkaProducer<>(envelopeProps)) {
            for (int i = 0; i < count; i++) {
                String id = "java-envelope-" + i;
                String payload = "{\"greeting\":\"Grüße, 世界 🚀\",\"n\":" + i + "}";
                GenericRecord job = new GenericRecordBuilder(jobSchema)
                    .set("id", id)
                    .set("type", "registry.envelope")
                    .set("payload", ByteBuffer.wrap(payload.getBytes(StandardCharsets.UTF_8)))
                    .set("payload_encoding", new GenericData.EnumSymbol(encoding, "JSON"))
                    .set("priority", "default")
                    .set("created_at", System.currentTimeMillis())
                    .build();
                producer.send(new ProducerRecord<>(topic, id, job)).get();
                System.out.println("registry.envelope " + id + " " + payload);
            }
        }

        // 2. Payloads written by the registry's serializer inside single-object envelopes. The
        //    serializer names the subject after its "topic" argument: "acme.Invoice" gives the
        //    subject acme.Invoice-value, the default of RegistryAvroPayload.
        BinaryMessageEncoder<GenericRecord> envelopeEncoder =
            new BinaryMessageEncoder<>(GenericData.get(), jobSchema);
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        try (AvroKafkaSerializer<GenericRecord> payloads = new AvroKafkaSerializer<>();
             KafkaProducer<String, byte[]> producer = new KafkaProducer<>(props)) {
            payloads.configure(serdeConfig(registryUrl), false);
            for (int i = 0; i < count; i++) {
                String id = "java-invoice-" + i;
                String note = "Grüße, 世界 🚀 #" + i;
                GenericRecord invoice = new GenericRecordBuilder(invoiceSchema)
                    .set("number", "INV-" + i)
                    .set("total_cents", 1000L + i)
                    .set("note", note)
                    .build();
                byte[] payload = payloads.serialize(invoiceSchema.getFullName(), invoice);
                GenericRecord job = new GenericRecordBuilder(jobSchema)
                    .set("id", id)
                    .set("type", "registry.invoice")
                    .set("payload", ByteBuffer.wrap(payload))
                    .set("payload_encoding", new GenericData.EnumSymbol(encoding, "AVRO"))
                    .set("priority", "default")
                    .set("created_at", System.currentTimeMillis())
                    .build();
                ByteBuffer encoded = envelopeEncoder.encode(job);
                byte[] value = new byte[encoded.remaining()];
                encoded.get(value);
                producer.send(new ProducerRecord<>(topic, id, value)).get();
                System.out.println("registry.invoice " + id + " {\"number\":\"INV-" + i
                    + "\",\"total_cents\":" + (1000 + i) + ",\"note\":\"" + note + "\"}");
            }
        }
    }
}
