package dev.herald.client

import org.json.JSONArray
import org.json.JSONObject

/**
 * A subscription's tag filter ([SubscribeOptions.tagsFilter], sent as `subscribe` param `tf`;
 * docs/protocol.md, "Tags and tag filters"): a [Leaf] compares one tag, a [Node] combines its
 * nodes. The server checks the grammar and the bounds (error 107 with the reason).
 */
sealed class TagFilter {
    internal abstract fun toJson(): JSONObject

    /**
     * Compares the tag [key] with [cmp]: `eq`, `neq`, `in`, `nin`, `ex`, `nex`, `starts`, `ends`,
     * `contains`, `lt`, `lte`, `gt`, `gte`; [value] is sent as `val` and [values] as `vals` (for
     * `in` / `nin`), each only when set.
     */
    data class Leaf @JvmOverloads constructor(
        val key: String, val cmp: String, val value: String? = null, val values: List<String>? = null,
    ) : TagFilter() {
        override fun toJson(): JSONObject {
            val o = JSONObject().put("key", key).put("cmp", cmp)
            value?.let { o.put("val", it) }
            values?.let { o.put("vals", JSONArray(it)) }
            return o
        }
    }

    /** [op] `and` (every node matches), `or` (some node does), `not` (its one node does not). */
    data class Node(val op: String, val nodes: List<TagFilter>) : TagFilter() {
        override fun toJson(): JSONObject =
            JSONObject().put("op", op).put("nodes", JSONArray(nodes.map { it.toJson() }))
    }
}
