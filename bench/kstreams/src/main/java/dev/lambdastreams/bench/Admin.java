package dev.lambdastreams.bench;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.AdminClient;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.TopicExistsException;

/**
 * Topic chores of bench/e2e, in one JVM each:
 * <pre>
 * Admin BOOTSTRAP create TOPIC PARTITIONS...   create topics (replication 1; existing ones are kept)
 * Admin BOOTSTRAP records TOPIC                print {"partitions":P,"records":N} (sum of end - start offsets)
 * Admin BOOTSTRAP delete-prefix PREFIX         delete every topic whose name starts with PREFIX
 * </pre>
 */
public final class Admin {
    private Admin() {}

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        try (AdminClient admin = AdminClient.create(props)) {
            switch (args[1]) {
                case "create" -> {
                    List<NewTopic> topics = new ArrayList<>();
                    for (int i = 2; i + 1 < args.length; i += 2) {
                        topics.add(new NewTopic(args[i], Integer.parseInt(args[i + 1]), (short) 1));
                    }
                    for (var e : admin.createTopics(topics).values().entrySet()) {
                        try {
                            e.getValue().get();
                        } catch (ExecutionException ex) {
                            if (!(ex.getCause() instanceof TopicExistsException)) {
                                throw ex;
                            }
                        }
                    }
                }
                case "records" -> {
                    String topic = args[2];
                    TopicDescription d;
                    try {
                        d = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
                    } catch (ExecutionException e) {
                        System.out.println("{\"partitions\":0,\"records\":0}");
                        return;
                    }
                    Map<TopicPartition, OffsetSpec> earliest = new java.util.HashMap<>();
                    Map<TopicPartition, OffsetSpec> latest = new java.util.HashMap<>();
                    d.partitions().forEach(p -> {
                        earliest.put(new TopicPartition(topic, p.partition()), OffsetSpec.earliest());
                        latest.put(new TopicPartition(topic, p.partition()), OffsetSpec.latest());
                    });
                    Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> lo = admin.listOffsets(earliest).all().get();
                    Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> hi = admin.listOffsets(latest).all().get();
                    long n = 0;
                    for (TopicPartition tp : hi.keySet()) {
                        n += hi.get(tp).offset() - lo.get(tp).offset();
                    }
                    System.out.printf("{\"partitions\":%d,\"records\":%d}%n", d.partitions().size(), n);
                }
                case "delete-prefix" -> {
                    String prefix = args[2];
                    List<String> names = new ArrayList<>();
                    for (String name : admin.listTopics().names().get()) {
                        if (name.startsWith(prefix)) {
                            names.add(name);
                        }
                    }
                    if (!names.isEmpty()) {
                        admin.deleteTopics(names).all().get(Duration.ofSeconds(60).toMillis(),
                            java.util.concurrent.TimeUnit.MILLISECONDS);
                    }
                    System.out.println("{\"deleted\":" + names.size() + "}");
                }
                default -> {
                    System.err.println("unknown command " + args[1]);
                    System.exit(64);
                }
            }
        }
    }
}
