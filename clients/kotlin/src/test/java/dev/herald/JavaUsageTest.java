package dev.herald;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;

import dev.herald.client.ClientListener;
import dev.herald.client.ClientOptions;
import dev.herald.client.ConnectedEvent;
import dev.herald.client.HeraldClient;
import dev.herald.client.PublicationEvent;
import dev.herald.client.PublishResult;
import dev.herald.client.SubscribeOptions;
import dev.herald.client.Subscription;
import dev.herald.client.SubscriptionListener;
import dev.herald.server.HeraldTokens;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
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
}
