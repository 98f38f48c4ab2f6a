package dev.herald;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.herald.client.ClientListener;
import dev.herald.client.ClientOptions;
import dev.herald.client.ConnectedEvent;
import dev.herald.client.DeltaType;
import dev.herald.client.HeraldClient;
import dev.herald.client.PublicationEvent;
import dev.herald.client.PublishResult;
import dev.herald.client.SubscribeOptions;
import dev.herald.client.Subscription;
import dev.herald.client.SubscriptionListener;
import dev.herald.server.HeraldTokens;
import java.io.InputStream;
import java.net.HttpURLConnection;
import java.net.URI;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

/** The SDK used from Java: listeners with default methods, futures, @JvmOverloads, @JvmStatic. */
@Timeout(60)
class JavaUsageTest {
    @Test
    void publishAndReceiveFromJava() throws Exception {
        try (HeraldNode node = new HeraldNode(Map.of())) {
            String token = HeraldTokens.connectionToken(HeraldNode.SECRET, "java-user", 60);
            CompletableFuture<String> connected = new CompletableFuture<>();
            CompletableFuture<PublicationEvent> received = new CompletableFuture<>();
            ClientOptions options = new ClientOptions().withToken(token).withTimeoutMs(5000);
            try (HeraldClient client = new HeraldClient(node.getWs(), options, new ClientListener() {
                @Override
                public void onConnected(ConnectedEvent event) {
                    connected.complete(event.getClient());
                }
            })) {
                client.connect();
                Subscription sub = client.subscribe("java", new SubscribeOptions(), new SubscriptionListener() {
                    @Override
                    public void onPublication(PublicationEvent event) {
                        received.complete(event);
                    }
                });
                assertNotNull(connected.get(10, TimeUnit.SECONDS));
                sub.readyAsync().get(10, TimeUnit.SECONDS);
                PublishResult r = client.publishAsync("java", Map.of("hello", "world")).get(10, TimeUnit.SECONDS);
                assertEquals(1L, r.getOffset());
                PublicationEvent p = received.get(10, TimeUnit.SECONDS);
                assertEquals("world", ((org.json.JSONObject) p.getData()).getString("hello"));
            }
        }
    }

    @Test
    void deltaSubscriptionFromJava() throws Exception {
        // A namespace that allows deltas; the publications come back whole, the second made from a delta.
        try (HeraldNode node = new HeraldNode(Map.of("HERALD_DEFAULT_NAMESPACE__ALLOW_DELTA", "true"))) {
            LinkedBlockingQueue<PublicationEvent> received = new LinkedBlockingQueue<>();
            try (HeraldClient client = new HeraldClient(node.getWs(), new ClientOptions().withTimeoutMs(5000))) {
                client.connect();
                SubscribeOptions delta = new SubscribeOptions(null, null, null, null, null, DeltaType.FOSSIL);
                Subscription sub = client.subscribe("book", delta, new SubscriptionListener() {
                    @Override
                    public void onPublication(PublicationEvent event) {
                        received.add(event);
                    }
                });
                sub.readyAsync().get(10, TimeUnit.SECONDS);
                String levels = "bids 101.5x20 101.4x35 101.3x12 101.2x80 asks 101.6x18 101.7x42 101.8x77 101.9x31".repeat(4);
                for (int seq = 1; seq <= 3; seq++) {
                    client.publishAsync("book", Map.of("seq", seq, "levels", levels)).get(10, TimeUnit.SECONDS);
                    PublicationEvent p = received.poll(10, TimeUnit.SECONDS);
                    assertNotNull(p, "publication " + seq + " within 10 s");
                    assertEquals(seq, ((org.json.JSONObject) p.getData()).getInt("seq"));
                    assertEquals(levels, ((org.json.JSONObject) p.getData()).getString("levels"));
                }
                // 2 and 3 came as deltas: the node computed them (an SDK that never asked for them gets 0).
                assertTrue(deltasComputed(node) >= 2, "herald_deltas_computed_total " + deltasComputed(node));
            }
        }
    }

    /** The node's herald_deltas_computed_total counter (GET /metrics). */
    private static double deltasComputed(HeraldNode node) throws Exception {
        HttpURLConnection c = (HttpURLConnection) URI.create(node.getHttp() + "/metrics").toURL().openConnection();
        c.setConnectTimeout(5000);
        c.setReadTimeout(5000);
        try (InputStream in = c.getInputStream()) {
            for (String line : new String(in.readAllBytes(), StandardCharsets.UTF_8).split("\n")) {
                if (line.startsWith("herald_deltas_computed_total ")) return Double.parseDouble(line.split(" ")[1]);
            }
        }
        return 0;
    }
}
