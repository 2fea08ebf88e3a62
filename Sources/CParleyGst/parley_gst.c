#include "parley_gst.h"

#define GST_USE_UNSTABLE_API 1
#include <gst/gst.h>
#include <gst/sdp/sdp.h>
#include <gst/rtp/rtp.h>
#include <gst/webrtc/webrtc.h>
#include <nice/agent.h>
#include <stdio.h>
#include <string.h>

int parley_gst_init(void) {
    GError *error = NULL;
    if (!gst_init_check(NULL, NULL, &error)) {
        g_clear_error(&error);
        return -1;
    }
    return 0;
}

char *parley_gst_missing_elements(const char *names) {
    gchar **list = g_strsplit(names, " ", -1);
    GString *missing = g_string_new(NULL);
    for (gchar **name = list; *name; name++) {
        if (**name == '\0') continue;
        GstElementFactory *factory = gst_element_factory_find(*name);
        if (factory) {
            gst_object_unref(factory);
        } else {
            if (missing->len) g_string_append_c(missing, ' ');
            g_string_append(missing, *name);
        }
    }
    g_strfreev(list);
    if (missing->len == 0) {
        g_string_free(missing, TRUE);
        return NULL;
    }
    return g_string_free(missing, FALSE);
}

void parley_gst_warm_dtls(void) {
    // Parley's certificate (parley_dtls_certificate.c); and GStreamer's own RSA one, which every
    // dtlsdec still generates on first use, as its starting point, before Parley's replaces it.
    parley_dtls_certificate_pem();
    GstElement *dec = gst_element_factory_make("dtlsdec", NULL);
    if (dec) gst_object_unref(dec);
}

void parley_gst_deinit(void) { gst_deinit(); }

void parley_free(void *pointer) { g_free(pointer); }

// MARK: Pipelines

static char *take_message(GError *error) {
    char *text = g_strdup(error ? error->message : "unknown error");
    g_clear_error(&error);
    return text;
}

void *parley_pipeline_new(const char *description, char **error) {
    GError *gerror = NULL;
    GstElement *pipeline = gst_parse_launch_full(description, NULL, GST_PARSE_FLAG_FATAL_ERRORS, &gerror);
    if (!pipeline) {
        *error = take_message(gerror);
        return NULL;
    }
    if (gerror) g_clear_error(&gerror);
    if (!GST_IS_PIPELINE(pipeline)) {
        // A description of one element parses to that element alone.
        GstElement *wrapper = gst_pipeline_new(NULL);
        gst_bin_add(GST_BIN(wrapper), pipeline);
        pipeline = wrapper;
    }
    return pipeline;
}

void *parley_bin_new(const char *description, char **error) {
    GError *gerror = NULL;
    GstElement *bin = gst_parse_bin_from_description_full(description, TRUE, NULL, GST_PARSE_FLAG_FATAL_ERRORS, &gerror);
    if (!bin) {
        *error = take_message(gerror);
        return NULL;
    }
    if (gerror) g_clear_error(&gerror);
    return bin;
}

int parley_capsfilter_add_audio_level(void *bin, const char *capsfilter, unsigned id) {
    GstElement *filter = gst_bin_get_by_name(GST_BIN(bin), capsfilter);
    if (!filter) return -1;
    GstCaps *caps = NULL;
    g_object_get(filter, "caps", &caps, NULL);
    if (!caps) {
        gst_object_unref(filter);
        return -2;
    }
    caps = gst_caps_make_writable(caps);
    // The form the audio level extension itself writes (direction, URI, attributes), so the
    // payloader's caps and these intersect, and webrtcbin offers `a=extmap:<id> … vad=on`.
    GValue array = G_VALUE_INIT, item = G_VALUE_INIT;
    g_value_init(&array, GST_TYPE_ARRAY);
    g_value_init(&item, G_TYPE_STRING);
    const char *parts[] = { "", "urn:ietf:params:rtp-hdrext:ssrc-audio-level", "vad=on" };
    for (int i = 0; i < 3; i++) {
        g_value_set_string(&item, parts[i]);
        gst_value_array_append_value(&array, &item);
    }
    char field[32];
    snprintf(field, sizeof field, "extmap-%u", id);
    gst_structure_set_value(gst_caps_get_structure(caps, 0), field, &array);
    g_value_unset(&item);
    g_value_unset(&array);
    g_object_set(filter, "caps", caps, NULL);
    gst_caps_unref(caps);
    gst_object_unref(filter);
    return 0;
}

int parley_element_set_state_playing(void *element) {
    return gst_element_set_state(GST_ELEMENT(element), GST_STATE_PLAYING) == GST_STATE_CHANGE_FAILURE ? -1 : 0;
}

int parley_element_set_state_ready(void *element) {
    return gst_element_set_state(GST_ELEMENT(element), GST_STATE_READY) == GST_STATE_CHANGE_FAILURE ? -1 : 0;
}

void parley_element_stop(void *element) {
    gst_element_set_state(GST_ELEMENT(element), GST_STATE_NULL);
    gst_element_get_state(GST_ELEMENT(element), NULL, NULL, GST_CLOCK_TIME_NONE);
}

void parley_object_unref(void *object) { gst_object_unref(object); }
void *parley_object_ref(void *object) { return g_object_ref(object); }

void *parley_bin_get(void *bin, const char *name) { return gst_bin_get_by_name(GST_BIN(bin), name); }

int parley_bin_add_and_link(void *bin, void *child, void *pad) {
    if (!gst_bin_add(GST_BIN(bin), GST_ELEMENT(child))) return -1;
    GstPad *sink = gst_element_get_static_pad(GST_ELEMENT(child), "sink");
    if (!sink) return -2;
    GstPadLinkReturn linked = gst_pad_link(GST_PAD(pad), sink);
    gst_object_unref(sink);
    if (linked != GST_PAD_LINK_OK) return -3;
    return gst_element_sync_state_with_parent(GST_ELEMENT(child)) ? 0 : -4;
}

int parley_bin_add_and_link_to(void *bin, void *child, void *destination) {
    if (!gst_bin_add(GST_BIN(bin), GST_ELEMENT(child))) return -1;
    if (!gst_element_link(GST_ELEMENT(child), GST_ELEMENT(destination))) return -2;
    return gst_element_sync_state_with_parent(GST_ELEMENT(child)) ? 0 : -3;
}

void parley_bin_hold_sources(void *bin, int hold) {
    GstIterator *sources = gst_bin_iterate_sources(GST_BIN(bin));
    GValue item = G_VALUE_INIT;
    while (gst_iterator_next(sources, &item) == GST_ITERATOR_OK) {
        GstElement *source = g_value_get_object(&item);
        gst_element_set_locked_state(source, hold ? TRUE : FALSE);
        if (hold) gst_element_set_state(source, GST_STATE_NULL);
        else gst_element_sync_state_with_parent(source);
        g_value_reset(&item);
    }
    g_value_unset(&item);
    gst_iterator_free(sources);
}

void parley_set_bool(void *object, const char *property, int value) { g_object_set(object, property, (gboolean)(value != 0), NULL); }
void parley_set_int(void *object, const char *property, int value) { g_object_set(object, property, (gint)value, NULL); }
void parley_set_uint(void *object, const char *property, unsigned int value) { g_object_set(object, property, (guint)value, NULL); }
void parley_set_double(void *object, const char *property, double value) { g_object_set(object, property, value, NULL); }
void parley_set_string(void *object, const char *property, const char *value) { g_object_set(object, property, value, NULL); }
void parley_set_from_string(void *object, const char *property, const char *value) { gst_util_set_object_arg(G_OBJECT(object), property, value); }

int parley_get_enum(void *object, const char *property) {
    gint value = 0;
    g_object_get(object, property, &value, NULL);
    return value;
}

// MARK: webrtcbin

typedef struct {
    parley_event_callback callback;
    void *context;
} Listener;

static void on_negotiation_needed(GstElement *webrtc, gpointer data) {
    Listener *l = data;
    l->callback(l->context, PARLEY_EVENT_NEGOTIATION_NEEDED, 0, NULL, NULL);
}

static void on_ice_candidate(GstElement *webrtc, guint mline, gchar *candidate, gpointer data) {
    Listener *l = data;
    l->callback(l->context, PARLEY_EVENT_ICE_CANDIDATE, mline, candidate, NULL);
}

static void on_notify_ice_connection(GObject *webrtc, GParamSpec *spec, gpointer data) {
    Listener *l = data;
    GstWebRTCICEConnectionState state;
    g_object_get(webrtc, "ice-connection-state", &state, NULL);
    l->callback(l->context, PARLEY_EVENT_ICE_CONNECTION_STATE, state, NULL, NULL);
}

static void on_notify_connection(GObject *webrtc, GParamSpec *spec, gpointer data) {
    Listener *l = data;
    GstWebRTCPeerConnectionState state;
    g_object_get(webrtc, "connection-state", &state, NULL);
    l->callback(l->context, PARLEY_EVENT_CONNECTION_STATE, state, NULL, NULL);
}

static void on_notify_ice_gathering(GObject *webrtc, GParamSpec *spec, gpointer data) {
    Listener *l = data;
    GstWebRTCICEGatheringState state;
    g_object_get(webrtc, "ice-gathering-state", &state, NULL);
    l->callback(l->context, PARLEY_EVENT_ICE_GATHERING_STATE, state, NULL, NULL);
}

static void on_pad_added(GstElement *webrtc, GstPad *pad, gpointer data) {
    Listener *l = data;
    if (GST_PAD_DIRECTION(pad) != GST_PAD_SRC) return;
    GstCaps *caps = gst_pad_get_current_caps(pad);
    if (!caps) caps = gst_pad_query_caps(pad, NULL);
    const gchar *media = NULL;
    if (caps && gst_caps_get_size(caps) > 0) media = gst_structure_get_string(gst_caps_get_structure(caps, 0), "media");
    l->callback(l->context, PARLEY_EVENT_PAD_ADDED, 0, media ? media : "", pad);
    if (caps) gst_caps_unref(caps);
}

static void on_data_channel(GstElement *webrtc, GObject *channel, gpointer data) {
    Listener *l = data;
    l->callback(l->context, PARLEY_EVENT_DATA_CHANNEL, 0, NULL, channel);
}

/// Each DTLS transport webrtcbin makes gets Parley's certificate, as its dtlsdec is added: before the
/// transport's encoder takes the connection and before any description names a fingerprint.
/// (webrtcbin 1.22 hashes the whole PEM for the fingerprint, key and all, when the PEM is not its
/// own: the engine writes the certificate's own fingerprint into its descriptions.)
static void on_deep_element_added(GstBin *bin, GstBin *sub_bin, GstElement *element, gpointer data) {
    GstElementFactory *factory = gst_element_get_factory(element);
    if (!factory || strcmp(GST_OBJECT_NAME(factory), "dtlsdec") != 0) return;
    const char *pem = parley_dtls_certificate_pem();
    if (pem) g_object_set(element, "pem", pem, NULL);
}

static GstBusSyncReply on_bus_message(GstBus *bus, GstMessage *message, gpointer data) {
    Listener *l = data;
    GError *error = NULL;
    gchar *debug = NULL;
    switch (GST_MESSAGE_TYPE(message)) {
    case GST_MESSAGE_ERROR:
        gst_message_parse_error(message, &error, &debug);
        l->callback(l->context, PARLEY_EVENT_ERROR, 0, error ? error->message : "error", GST_MESSAGE_SRC(message));
        break;
    case GST_MESSAGE_WARNING:
        gst_message_parse_warning(message, &error, &debug);
        l->callback(l->context, PARLEY_EVENT_WARNING, 0, error ? error->message : "warning", GST_MESSAGE_SRC(message));
        break;
    default:
        break;
    }
    g_clear_error(&error);
    g_free(debug);
    // A sync handler that drops a message owns it.
    gst_message_unref(message);
    return GST_BUS_DROP;
}

void parley_webrtc_attach(void *pipeline, void *webrtc, parley_event_callback callback, void *context) {
    Listener *l = g_new0(Listener, 1);
    l->callback = callback;
    l->context = context;
    // The listener is freed with the last handler (the bus handler's notify).
    g_signal_connect(webrtc, "on-negotiation-needed", G_CALLBACK(on_negotiation_needed), l);
    g_signal_connect(webrtc, "on-ice-candidate", G_CALLBACK(on_ice_candidate), l);
    g_signal_connect(webrtc, "notify::ice-connection-state", G_CALLBACK(on_notify_ice_connection), l);
    g_signal_connect(webrtc, "notify::ice-gathering-state", G_CALLBACK(on_notify_ice_gathering), l);
    g_signal_connect(webrtc, "notify::connection-state", G_CALLBACK(on_notify_connection), l);
    g_signal_connect(webrtc, "pad-added", G_CALLBACK(on_pad_added), l);
    g_signal_connect(webrtc, "on-data-channel", G_CALLBACK(on_data_channel), l);
    g_signal_connect(webrtc, "deep-element-added", G_CALLBACK(on_deep_element_added), NULL);
    GstBus *bus = gst_element_get_bus(GST_ELEMENT(pipeline));
    gst_bus_set_sync_handler(bus, on_bus_message, l, g_free);
    gst_object_unref(bus);
}

void parley_webrtc_detach(void *pipeline, void *webrtc, void *context) {
    GCallback handlers[] = { G_CALLBACK(on_negotiation_needed), G_CALLBACK(on_ice_candidate), G_CALLBACK(on_notify_ice_connection),
                             G_CALLBACK(on_notify_connection), G_CALLBACK(on_notify_ice_gathering), G_CALLBACK(on_pad_added), G_CALLBACK(on_data_channel),
                             G_CALLBACK(on_deep_element_added) };
    for (size_t i = 0; i < sizeof(handlers) / sizeof(handlers[0]); i++)
        g_signal_handlers_disconnect_matched(webrtc, G_SIGNAL_MATCH_FUNC, 0, 0, NULL, handlers[i], NULL);
    // The bus handler's notify frees the listener.
    GstBus *bus = gst_element_get_bus(GST_ELEMENT(pipeline));
    gst_bus_set_sync_handler(bus, NULL, NULL, NULL);
    gst_object_unref(bus);
}

typedef struct {
    parley_promise_callback callback;
    void *context;
    gboolean answered;
} PromiseListener;

static void on_promise(GstPromise *promise, gpointer data) {
    PromiseListener *l = data;
    if (l->answered) return;
    l->answered = TRUE;
    const GstStructure *reply = NULL;
    int replied = gst_promise_wait(promise) == GST_PROMISE_RESULT_REPLIED;
    if (replied) reply = gst_promise_get_reply(promise);
    l->callback(l->context, replied, (void *)reply);
}

/// A promise webrtcbin drops without replying (a closing element does) still answers, with no reply,
/// so no caller waits forever.
static void on_promise_freed(gpointer data) {
    PromiseListener *l = data;
    if (!l->answered) {
        l->answered = TRUE;
        l->callback(l->context, 0, NULL);
    }
    g_free(l);
}

static GstPromise *make_promise(parley_promise_callback callback, void *context) {
    PromiseListener *l = g_new0(PromiseListener, 1);
    l->callback = callback;
    l->context = context;
    return gst_promise_new_with_change_func(on_promise, l, on_promise_freed);
}

void parley_webrtc_create_offer(void *webrtc, parley_promise_callback callback, void *context) {
    GstPromise *promise = make_promise(callback, context);
    g_signal_emit_by_name(webrtc, "create-offer", NULL, promise);
    gst_promise_unref(promise);
}

void parley_webrtc_create_answer(void *webrtc, parley_promise_callback callback, void *context) {
    GstPromise *promise = make_promise(callback, context);
    g_signal_emit_by_name(webrtc, "create-answer", NULL, promise);
    gst_promise_unref(promise);
}

char *parley_reply_error(void *reply) {
    if (!reply) return NULL;
    GError *error = NULL;
    if (gst_structure_has_field((GstStructure *)reply, "error")) {
        gst_structure_get((GstStructure *)reply, "error", G_TYPE_ERROR, &error, NULL);
        return take_message(error);
    }
    return NULL;
}

char *parley_reply_sdp(void *reply, char **error) {
    if (!reply) {
        *error = g_strdup("no reply");
        return NULL;
    }
    char *failure = parley_reply_error(reply);
    if (failure) {
        *error = failure;
        return NULL;
    }
    GstStructure *s = reply;
    const gchar *field = gst_structure_has_field(s, "offer") ? "offer" : "answer";
    GstWebRTCSessionDescription *description = NULL;
    gst_structure_get(s, field, GST_TYPE_WEBRTC_SESSION_DESCRIPTION, &description, NULL);
    if (!description) {
        *error = g_strdup("the reply holds no session description");
        return NULL;
    }
    char *text = gst_sdp_message_as_text(description->sdp);
    gst_webrtc_session_description_free(description);
    return text;
}

int parley_webrtc_set_description(void *webrtc, int local, const char *type, const char *sdp,
                                  parley_promise_callback callback, void *context, char **error) {
    GstWebRTCSDPType sdp_type;
    if (strcmp(type, "offer") == 0) sdp_type = GST_WEBRTC_SDP_TYPE_OFFER;
    else if (strcmp(type, "answer") == 0) sdp_type = GST_WEBRTC_SDP_TYPE_ANSWER;
    else if (strcmp(type, "pranswer") == 0) sdp_type = GST_WEBRTC_SDP_TYPE_PRANSWER;
    else if (strcmp(type, "rollback") == 0) sdp_type = GST_WEBRTC_SDP_TYPE_ROLLBACK;
    else {
        *error = g_strdup_printf("unknown description type '%s'", type);
        return -1;
    }
    GstSDPMessage *message = NULL;
    gst_sdp_message_new(&message);
    if (gst_sdp_message_parse_buffer((const guint8 *)sdp, strlen(sdp), message) != GST_SDP_OK) {
        gst_sdp_message_free(message);
        *error = g_strdup("the SDP does not parse");
        return -1;
    }
    GstWebRTCSessionDescription *description = gst_webrtc_session_description_new(sdp_type, message);
    GstPromise *promise = make_promise(callback, context);
    g_signal_emit_by_name(webrtc, local ? "set-local-description" : "set-remote-description", description, promise);
    gst_promise_unref(promise);
    gst_webrtc_session_description_free(description);
    return 0;
}

void parley_webrtc_add_ice_candidate(void *webrtc, unsigned int mline, const char *candidate) {
    g_signal_emit_by_name(webrtc, "add-ice-candidate", mline, candidate);
}

int parley_webrtc_add_turn_server(void *webrtc, const char *uri) {
    gboolean added = FALSE;
    g_signal_emit_by_name(webrtc, "add-turn-server", uri, &added);
    return added ? 1 : 0;
}

void parley_webrtc_get_stats(void *webrtc, parley_promise_callback callback, void *context) {
    GstPromise *promise = make_promise(callback, context);
    g_signal_emit_by_name(webrtc, "get-stats", NULL, promise);
    gst_promise_unref(promise);
}

static gboolean number(const GstStructure *s, const char *field, double *out) {
    const GValue *value = gst_structure_get_value(s, field);
    if (!value) return FALSE;
    GValue converted = G_VALUE_INIT;
    g_value_init(&converted, G_TYPE_DOUBLE);
    gboolean ok = g_value_transform(value, &converted);
    if (ok) *out = g_value_get_double(&converted);
    g_value_unset(&converted);
    return ok;
}

// 1.22 with audio and video bundled on one transport labels every RTP stream with the kind of
// one of them ("video" for the audio stream too), so the kind is judged by the stream's clock
// rate (48 kHz Opus, 90 kHz video), which the nested RTP source statistics carry: a first pass
// collects each SSRC's rate from wherever a source's statistics appear.
typedef struct {
    GHashTable *rates;  // SSRC -> clock rate
    parley_stats *out;
} stats_pass;

static void note_source_rate(GHashTable *rates, const GstStructure *s) {
    const GstStructure *source = NULL;
    const GValue *value = gst_structure_get_value(s, "gst-rtpsource-stats");
    if (value && GST_VALUE_HOLDS_STRUCTURE(value)) source = gst_value_get_structure(value);
    if (!source) return;
    guint ssrc = 0;
    gint rate = 0;
    if (gst_structure_get_uint(source, "ssrc", &ssrc) && gst_structure_get_int(source, "clock-rate", &rate) && rate > 0) {
        g_hash_table_insert(rates, GUINT_TO_POINTER(ssrc), GINT_TO_POINTER(rate));
    }
}

static gboolean collect_rates(GQuark field, const GValue *value, gpointer data) {
    (void)field;
    if (GST_VALUE_HOLDS_STRUCTURE(value)) note_source_rate(((stats_pass *)data)->rates, gst_value_get_structure(value));
    return TRUE;
}

static gboolean is_audio(const GstStructure *s, GHashTable *rates) {
    guint ssrc = 0;
    if (gst_structure_get_uint(s, "ssrc", &ssrc) && g_hash_table_contains(rates, GUINT_TO_POINTER(ssrc))) {
        return GPOINTER_TO_INT(g_hash_table_lookup(rates, GUINT_TO_POINTER(ssrc))) == 48000;
    }
    const gchar *kind = gst_structure_get_string(s, "kind");
    return kind == NULL || g_strcmp0(kind, "audio") == 0;
}

static gboolean collect_stats(GQuark field, const GValue *value, gpointer data) {
    (void)field;
    stats_pass *pass = data;
    parley_stats *out = pass->out;
    if (!GST_VALUE_HOLDS_STRUCTURE(value)) return TRUE;
    const GstStructure *s = gst_value_get_structure(value);
    GstWebRTCStatsType type = 0;
    if (!gst_structure_get(s, "type", GST_TYPE_WEBRTC_STATS_TYPE, &type, NULL)) return TRUE;
    double x;
    switch (type) {
    case GST_WEBRTC_STATS_INBOUND_RTP:
        if (!is_audio(s, pass->rates)) break;
        if (number(s, "packets-received", &x)) out->packets_received += (uint64_t)x;
        if (number(s, "packets-lost", &x)) out->packets_lost += (int64_t)x;
        if (number(s, "bytes-received", &x)) out->bytes_received += (uint64_t)x;
        // 1.22 reports jitter in seconds.
        if (number(s, "jitter", &x) && x * 1000.0 > out->jitter_ms) out->jitter_ms = x * 1000.0;
        break;
    case GST_WEBRTC_STATS_OUTBOUND_RTP:
        if (!is_audio(s, pass->rates)) break;
        if (number(s, "bytes-sent", &x)) out->bytes_sent += (uint64_t)x;
        if (number(s, "packets-sent", &x)) out->packets_sent += (uint64_t)x;
        break;
    case GST_WEBRTC_STATS_REMOTE_INBOUND_RTP:
        // 1.22's candidate-pair carries no RTT; the remote report's round trip does.
        if (!is_audio(s, pass->rates)) break;
        if (number(s, "round-trip-time", &x) && x > 0) out->round_trip_time_ms = x * 1000.0;
        if (number(s, "fraction-lost", &x) && x >= 0 && x > out->remote_fraction_lost) out->remote_fraction_lost = x;
        break;
    default:
        break;
    }
    return TRUE;
}

void parley_stats_read(void *reply, parley_stats *out) {
    memset(out, 0, sizeof(*out));
    out->round_trip_time_ms = -1;
    out->jitter_ms = -1;
    out->remote_fraction_lost = -1;
    if (!reply) return;
    stats_pass pass = { g_hash_table_new(g_direct_hash, g_direct_equal), out };
    gst_structure_foreach((GstStructure *)reply, collect_rates, &pass);
    gst_structure_foreach((GstStructure *)reply, collect_stats, &pass);
    g_hash_table_destroy(pass.rates);
}

// MARK: Receive jitter buffers

typedef void (*element_visitor)(GstElement *element, void *data);

static int each_element_of(void *webrtc, const char *factory_name, element_visitor visit, void *data) {
    // Collected first, visited after: a resync (rtpbin adding an element meanwhile) starts the
    // collection again rather than visiting some elements twice and others not at all.
    GPtrArray *found = g_ptr_array_new_with_free_func(gst_object_unref);
    GstIterator *it = gst_bin_iterate_recurse(GST_BIN(webrtc));
    GValue item = G_VALUE_INIT;
    gboolean done = FALSE;
    while (!done) {
        switch (gst_iterator_next(it, &item)) {
        case GST_ITERATOR_OK: {
            GstElement *element = g_value_get_object(&item);
            GstElementFactory *factory = gst_element_get_factory(element);
            if (factory && g_strcmp0(GST_OBJECT_NAME(factory), factory_name) == 0) g_ptr_array_add(found, gst_object_ref(element));
            g_value_reset(&item);
            break;
        }
        case GST_ITERATOR_RESYNC:
            g_ptr_array_set_size(found, 0);
            gst_iterator_resync(it);
            break;
        default:
            done = TRUE;
            break;
        }
    }
    g_value_unset(&item);
    gst_iterator_free(it);
    for (guint i = 0; i < found->len; i++) visit(g_ptr_array_index(found, i), data);
    int count = (int)found->len;
    g_ptr_array_unref(found);
    return count;
}

/// The gaps in what one jitter buffer let out: packets it gave up on or got too late, counted in
/// runs of consecutive sequence numbers (G.107's burst ratio is made of them).
typedef struct {
    GMutex lock;
    gboolean started;
    guint16 last;
    guint64 gap_packets;
    guint64 gap_runs;
} parley_gaps;

static void parley_gaps_free(gpointer data) {
    parley_gaps *gaps = data;
    g_mutex_clear(&gaps->lock);
    g_free(gaps);
}

static GstPadProbeReturn count_gaps(GstPad *pad, GstPadProbeInfo *info, gpointer data) {
    parley_gaps *gaps = data;
    GstBuffer *buffer = GST_PAD_PROBE_INFO_BUFFER(info);
    GstRTPBuffer rtp = GST_RTP_BUFFER_INIT;
    if (!buffer || !gst_rtp_buffer_map(buffer, GST_MAP_READ, &rtp)) return GST_PAD_PROBE_OK;
    guint16 seq = gst_rtp_buffer_get_seq(&rtp);
    gst_rtp_buffer_unmap(&rtp);
    g_mutex_lock(&gaps->lock);
    if (gaps->started) {
        guint16 gap = (guint16)(seq - gaps->last - 1);
        // A gap of thousands is a new stream or a restart of its numbering, not loss.
        if (gap > 0 && gap < 1000) {
            gaps->gap_packets += gap;
            gaps->gap_runs += 1;
        }
    }
    gaps->started = TRUE;
    gaps->last = seq;
    g_mutex_unlock(&gaps->lock);
    return GST_PAD_PROBE_OK;
}

/// The jitter buffer's gap counter, made (and its probe put on the buffer's output) on first use.
static parley_gaps *gaps_of(GstElement *jitterbuffer) {
    parley_gaps *gaps = g_object_get_data(G_OBJECT(jitterbuffer), "parley-gaps");
    if (gaps) return gaps;
    GstPad *src = gst_element_get_static_pad(jitterbuffer, "src");
    if (!src) return NULL;
    gaps = g_new0(parley_gaps, 1);
    g_mutex_init(&gaps->lock);
    g_object_set_data_full(G_OBJECT(jitterbuffer), "parley-gaps", gaps, parley_gaps_free);
    gst_pad_add_probe(src, GST_PAD_PROBE_TYPE_BUFFER, count_gaps, gaps, NULL);
    gst_object_unref(src);
    return gaps;
}

static void add_jitter_stats(GstElement *jitterbuffer, void *data) {
    parley_jitter_stats *out = data;
    parley_gaps *gaps = gaps_of(jitterbuffer);
    if (gaps) {
        g_mutex_lock(&gaps->lock);
        out->gap_packets += gaps->gap_packets;
        out->gap_runs += gaps->gap_runs;
        g_mutex_unlock(&gaps->lock);
    }
    GstStructure *stats = NULL;
    g_object_get(jitterbuffer, "stats", &stats, NULL);
    if (stats) {
        guint64 value = 0;
        if (gst_structure_get_uint64(stats, "num-pushed", &value)) out->pushed += value;
        if (gst_structure_get_uint64(stats, "num-lost", &value)) out->lost += value;
        if (gst_structure_get_uint64(stats, "num-late", &value)) out->late += value;
        if (gst_structure_get_uint64(stats, "rtx-count", &value)) out->retransmissions_asked += value;
        if (gst_structure_get_uint64(stats, "rtx-success-count", &value)) out->retransmissions_received += value;
        if (gst_structure_get_uint64(stats, "rtx-rtt", &value) && value / 1e6 > out->retransmission_rtt_ms) {
            out->retransmission_rtt_ms = value / 1e6;
        }
        if (gst_structure_get_uint64(stats, "avg-jitter", &value) && value > 0 && value / 1e6 > out->jitter_ms) {
            out->jitter_ms = value / 1e6;
        }
        gst_structure_free(stats);
    }
    guint latency = 0;
    g_object_get(jitterbuffer, "latency", &latency, NULL);
    out->latency_ms = latency;
}

// MARK: Sending from the connection on

/// A send chain waiting for the call to connect.
typedef struct {
    GMutex lock;
    GstPad *end;       // the chain's last pad, into webrtcbin: dropped until the connection
    gulong dropping;   // 0 once released
    GstPad *file;      // a played file's pad into the chain's mixer, or NULL: held until then
    gulong holding;
} parley_waiting_chain;

static void parley_waiting_chain_free(gpointer data, GClosure *closure) {
    parley_waiting_chain *chain = data;
    gst_object_unref(chain->end);
    if (chain->file) gst_object_unref(chain->file);
    g_mutex_clear(&chain->lock);
    g_free(chain);
}

static GstPadProbeReturn drop_buffers(GstPad *pad, GstPadProbeInfo *info, gpointer data) {
    return GST_PAD_PROBE_DROP;
}

/// A blocking probe: buffers wait; events (caps, segment) pass, so the mixer's pad is ready.
static GstPadProbeReturn hold_buffers(GstPad *pad, GstPadProbeInfo *info, gpointer data) {
    return GST_PAD_PROBE_OK;
}

static void start_sending(parley_waiting_chain *chain, GstElement *webrtc) {
    g_mutex_lock(&chain->lock);
    gulong dropping = chain->dropping, holding = chain->holding;
    chain->dropping = chain->holding = 0;
    g_mutex_unlock(&chain->lock);
    if (holding) {
        // The file's first sample plays now: its running time starts at the pipeline's (setting
        // the offset makes the pad send its segment again, shifted, before the next buffer).
        GstClockTime now = gst_element_get_current_running_time(webrtc);
        if (GST_CLOCK_TIME_IS_VALID(now)) gst_pad_set_offset(chain->file, (gint64)now);
        gst_pad_remove_probe(chain->file, holding);
    }
    if (dropping) gst_pad_remove_probe(chain->end, dropping);
}

static gboolean is_connected(GstElement *webrtc) {
    GstWebRTCPeerConnectionState state = GST_WEBRTC_PEER_CONNECTION_STATE_NEW;
    g_object_get(webrtc, "connection-state", &state, NULL);
    return state == GST_WEBRTC_PEER_CONNECTION_STATE_CONNECTED;
}

static void on_connection_state_for_chain(GstElement *webrtc, GParamSpec *spec, gpointer data) {
    if (is_connected(webrtc)) start_sending(data, webrtc);
}

static GstPad *src_pad_of(void *bin, const char *name) {
    GstElement *element = gst_bin_get_by_name(GST_BIN(bin), name);
    if (!element) return NULL;
    GstPad *pad = gst_element_get_static_pad(element, "src");
    gst_object_unref(element);
    return pad;
}

int parley_send_from_connection(void *webrtc, void *bin, const char *end, const char *file) {
    GstPad *end_pad = src_pad_of(bin, end);
    GstPad *file_pad = file ? src_pad_of(bin, file) : NULL;
    if (!end_pad || (file && !file_pad)) {
        if (end_pad) gst_object_unref(end_pad);
        if (file_pad) gst_object_unref(file_pad);
        return 0;
    }
    parley_waiting_chain *chain = g_new0(parley_waiting_chain, 1);
    g_mutex_init(&chain->lock);
    chain->end = end_pad;
    chain->file = file_pad;
    GstPadProbeType buffers = GST_PAD_PROBE_TYPE_BUFFER | GST_PAD_PROBE_TYPE_BUFFER_LIST;
    chain->dropping = gst_pad_add_probe(end_pad, buffers, drop_buffers, NULL, NULL);
    if (file_pad) chain->holding = gst_pad_add_probe(file_pad, GST_PAD_PROBE_TYPE_BLOCK | buffers, hold_buffers, NULL, NULL);
    // Freed with webrtcbin (the handler stays connected after the start, doing nothing); it holds
    // the chain's pads, never the pipeline, which would then never be freed.
    g_signal_connect_data(webrtc, "notify::connection-state", G_CALLBACK(on_connection_state_for_chain), chain,
                          parley_waiting_chain_free, 0);
    // A chain made after the call connected (a renegotiation adding video) sends at once.
    if (is_connected(GST_ELEMENT(webrtc))) start_sending(chain, GST_ELEMENT(webrtc));
    return 1;
}

/// What `exact_gaps` knows of an Opus stream: its last packet, and the audio a packet carries.
typedef struct {
    gboolean started;
    guint16 last_seq;
    guint32 last_timestamp;
    GstClockTime packet_duration;  // 0 until two packets in a row were seen
} parley_opus_gaps;

static GstPadProbeReturn exact_gaps(GstPad *pad, GstPadProbeInfo *info, gpointer data) {
    parley_opus_gaps *gaps = data;
    if (info->type & GST_PAD_PROBE_TYPE_BUFFER) {
        GstBuffer *buffer = GST_PAD_PROBE_INFO_BUFFER(info);
        GstRTPBuffer rtp = GST_RTP_BUFFER_INIT;
        if (!buffer || !gst_rtp_buffer_map(buffer, GST_MAP_READ, &rtp)) return GST_PAD_PROBE_OK;
        guint16 seq = gst_rtp_buffer_get_seq(&rtp);
        guint32 timestamp = gst_rtp_buffer_get_timestamp(&rtp);
        gst_rtp_buffer_unmap(&rtp);
        if (gaps->started) {
            gint16 packets = (gint16)(seq - gaps->last_seq);
            guint32 samples = timestamp - gaps->last_timestamp;
            // Opus's RTP clock is 48 kHz whatever the audio's rate (RFC 7587, 4.1); a packet holds
            // 2.5 to 120 ms. Packets around a gap tell it too, if it was whole packets.
            if (packets > 0 && packets <= 8 && samples % packets == 0) {
                guint32 per_packet = samples / packets;
                if (per_packet >= 120 && per_packet <= 5760) gaps->packet_duration = gst_util_uint64_scale(per_packet, GST_SECOND, 48000);
            }
        }
        gaps->started = TRUE;
        gaps->last_seq = seq;
        gaps->last_timestamp = timestamp;
        return GST_PAD_PROBE_OK;
    }
    GstEvent *event = GST_PAD_PROBE_INFO_EVENT(info);
    const GstStructure *lost = event ? gst_event_get_structure(event) : NULL;
    if (!lost || !gst_structure_has_name(lost, "GstRTPPacketLost") || gaps->packet_duration == 0) return GST_PAD_PROBE_OK;
    // One event may stand for several packets lost in a row, with their estimated duration.
    guint64 estimated = 0;
    gst_structure_get_uint64(lost, "duration", &estimated);
    guint64 packets = MAX(1, (estimated + gaps->packet_duration / 2) / gaps->packet_duration);
    GstStructure *exact = gst_structure_copy(lost);
    gst_structure_set(exact, "duration", G_TYPE_UINT64, (guint64)(packets * gaps->packet_duration), NULL);
    GstEvent *replacement = gst_event_new_custom(GST_EVENT_TYPE(event), exact);
    gst_event_set_seqnum(replacement, gst_event_get_seqnum(event));
    gst_event_unref(event);
    GST_PAD_PROBE_INFO_DATA(info) = replacement;
    return GST_PAD_PROBE_OK;
}

int parley_opus_depay_exact_gaps(void *depay) {
    GstPad *sink = gst_element_get_static_pad(GST_ELEMENT(depay), "sink");
    if (!sink) return 0;
    gst_pad_add_probe(sink, GST_PAD_PROBE_TYPE_BUFFER | GST_PAD_PROBE_TYPE_EVENT_DOWNSTREAM, exact_gaps,
                      g_new0(parley_opus_gaps, 1), g_free);
    gst_object_unref(sink);
    return 1;
}

int parley_jitter_buffers_read(void *webrtc, parley_jitter_stats *out) {
    memset(out, 0, sizeof(*out));
    out->jitter_ms = -1;
    return each_element_of(webrtc, "rtpjitterbuffer", add_jitter_stats, out);
}

static void set_latency(GstElement *jitterbuffer, void *data) {
    g_object_set(jitterbuffer, "latency", *(guint *)data, NULL);
}

void parley_jitter_buffers_set_latency(void *webrtc, unsigned int latency_ms) {
    guint latency = latency_ms;
    g_object_set(webrtc, "latency", latency, NULL);
    each_element_of(webrtc, "rtpjitterbuffer", set_latency, &latency);
}

static void on_new_transceiver(GstElement *webrtc, GObject *transceiver, gpointer data) {
    g_object_set(transceiver, "do-nack", TRUE, NULL);
}

void parley_webrtc_enable_retransmission(void *webrtc) {
    // Every transceiver, whether a sink pad or a remote offer made it, negotiates NACK and RTX
    // before its first description is built.
    g_signal_connect(webrtc, "on-new-transceiver", G_CALLBACK(on_new_transceiver), NULL);
    // webrtcbin 1.22 turns NACKs on in a jitter buffer only if the far side's description named
    // the stream's SSRC when the buffer was made, which depends on timing; rtpbin's own switch
    // covers every jitter buffer, made before or after.
    GstElement *rtpbin = gst_bin_get_by_name(GST_BIN(webrtc), "rtpbin");
    if (rtpbin) {
        g_object_set(rtpbin, "do-retransmission", TRUE, NULL);
        gst_object_unref(rtpbin);
    }
}

static void add_retransmissions_asked(GstElement *rtx, void *data) {
    guint requests = 0;
    g_object_get(rtx, "num-rtx-requests", &requests, NULL);
    *(uint64_t *)data += requests;
}

uint64_t parley_retransmissions_asked(void *webrtc) {
    uint64_t total = 0;
    each_element_of(webrtc, "rtprtxsend", add_retransmissions_asked, &total);
    return total;
}

static void set_rtcp_interval(GstElement *session, void *data) {
    g_object_set(session, "rtcp-min-interval", *(guint64 *)data, NULL);
}

int parley_rtp_sessions_set_rtcp_interval(void *webrtc, unsigned int interval_ms) {
    guint64 interval = (guint64)interval_ms * GST_MSECOND;
    return each_element_of(webrtc, "rtpsession", set_rtcp_interval, &interval);
}

// MARK: ICE agent

static NiceAgent *nice_agent_of(void *webrtc) {
    GObject *ice = NULL;
    g_object_get(webrtc, "ice-agent", &ice, NULL);
    if (!ice) return NULL;
    NiceAgent *agent = NULL;
    if (g_object_class_find_property(G_OBJECT_GET_CLASS(ice), "agent")) g_object_get(ice, "agent", &agent, NULL);
    g_object_unref(ice);
    return agent;
}

int parley_ice_add_local_address(void *webrtc, const char *address) {
    NiceAgent *agent = nice_agent_of(webrtc);
    if (!agent) return -1;
    NiceAddress nice_address;
    nice_address_init(&nice_address);
    int result = -2;
    if (nice_address_set_from_string(&nice_address, address)) result = nice_agent_add_local_address(agent, &nice_address) ? 0 : -3;
    g_object_unref(agent);
    return result;
}

void parley_ice_configure(void *webrtc, unsigned int pacing_ms, int tcp) {
    NiceAgent *agent = nice_agent_of(webrtc);
    if (!agent) return;
    g_object_set(agent, "upnp", FALSE, "stun-pacing-timer", (guint)pacing_ms, "ice-tcp", tcp ? TRUE : FALSE, NULL);
    g_object_unref(agent);
}

void parley_ice_restart(void *webrtc) {
    NiceAgent *agent = nice_agent_of(webrtc);
    if (!agent) return;
    nice_agent_restart(agent);
    g_object_unref(agent);
}

int parley_ice_selected_pair(void *webrtc, char *local_type, char *remote_type, char *local_address, int *local_port,
                             char *remote_address, int *remote_port) {
    static const char *types[] = {"host", "srflx", "prflx", "relay"};
    NiceAgent *agent = nice_agent_of(webrtc);
    if (!agent) return -1;
    int result = -2;
    // webrtcbin numbers its libnice streams from 1; with max-bundle the first one carries everything.
    for (guint stream = 1; stream <= 8 && result != 0; stream++) {
        NiceCandidate *local = NULL, *remote = NULL;
        if (!nice_agent_get_selected_pair(agent, stream, 1, &local, &remote) || !local || !remote) continue;
        g_strlcpy(local_type, local->type <= NICE_CANDIDATE_TYPE_RELAYED ? types[local->type] : "unknown", 16);
        g_strlcpy(remote_type, remote->type <= NICE_CANDIDATE_TYPE_RELAYED ? types[remote->type] : "unknown", 16);
        nice_address_to_string(&local->addr, local_address);
        *local_port = (int)nice_address_get_port(&local->addr);
        nice_address_to_string(&remote->addr, remote_address);
        *remote_port = (int)nice_address_get_port(&remote->addr);
        result = 0;
    }
    g_object_unref(agent);
    return result;
}

// MARK: Data channels

typedef struct {
    parley_channel_callback callback;
    void *context;
} ChannelListener;

static void on_channel_open(GObject *channel, gpointer data) {
    ChannelListener *l = data;
    l->callback(l->context, PARLEY_CHANNEL_OPEN, NULL, 0);
}

static void on_channel_close(GObject *channel, gpointer data) {
    ChannelListener *l = data;
    l->callback(l->context, PARLEY_CHANNEL_CLOSED, NULL, 0);
}

static void on_channel_error(GObject *channel, GError *error, gpointer data) {
    ChannelListener *l = data;
    const char *message = error ? error->message : "data channel error";
    l->callback(l->context, PARLEY_CHANNEL_ERROR, message, strlen(message));
}

static void on_channel_text(GObject *channel, gchar *text, gpointer data) {
    ChannelListener *l = data;
    l->callback(l->context, PARLEY_CHANNEL_TEXT, text, text ? strlen(text) : 0);
}

static void on_channel_binary(GObject *channel, GBytes *bytes, gpointer data) {
    ChannelListener *l = data;
    gsize length = 0;
    gconstpointer raw = bytes ? g_bytes_get_data(bytes, &length) : NULL;
    l->callback(l->context, PARLEY_CHANNEL_BINARY, raw, length);
}

void *parley_webrtc_create_data_channel(void *webrtc, const char *label, int ordered, int max_retransmits) {
    GstStructure *options = gst_structure_new_empty("options");
    gst_structure_set(options, "ordered", G_TYPE_BOOLEAN, (gboolean)(ordered != 0), NULL);
    if (max_retransmits >= 0) gst_structure_set(options, "max-retransmits", G_TYPE_INT, max_retransmits, NULL);
    GObject *channel = NULL;
    g_signal_emit_by_name(webrtc, "create-data-channel", label, options, &channel);
    gst_structure_free(options);
    return channel;
}

void parley_channel_attach(void *channel, parley_channel_callback callback, void *context) {
    ChannelListener *l = g_new0(ChannelListener, 1);
    l->callback = callback;
    l->context = context;
    g_signal_connect(channel, "on-open", G_CALLBACK(on_channel_open), l);
    g_signal_connect(channel, "on-close", G_CALLBACK(on_channel_close), l);
    g_signal_connect(channel, "on-error", G_CALLBACK(on_channel_error), l);
    g_signal_connect(channel, "on-message-string", G_CALLBACK(on_channel_text), l);
    // The listener goes with the last handler.
    g_signal_connect_data(channel, "on-message-data", G_CALLBACK(on_channel_binary), l, (GClosureNotify)(void (*)(void))g_free, 0);
}

void parley_channel_detach(void *channel, void *context) {
    GCallback handlers[] = { G_CALLBACK(on_channel_open), G_CALLBACK(on_channel_close), G_CALLBACK(on_channel_error),
                             G_CALLBACK(on_channel_text), G_CALLBACK(on_channel_binary) };
    for (size_t i = 0; i < sizeof(handlers) / sizeof(handlers[0]); i++)
        g_signal_handlers_disconnect_matched(channel, G_SIGNAL_MATCH_FUNC, 0, 0, NULL, handlers[i], NULL);
}

char *parley_channel_label(void *channel) {
    gchar *label = NULL;
    g_object_get(channel, "label", &label, NULL);
    return label;
}

int parley_channel_ordered(void *channel) {
    gboolean ordered = TRUE;
    g_object_get(channel, "ordered", &ordered, NULL);
    return ordered ? 1 : 0;
}

int parley_channel_ready_state(void *channel) { return parley_get_enum(channel, "ready-state"); }

void parley_channel_send_text(void *channel, const char *text) { g_signal_emit_by_name(channel, "send-string", text); }

void parley_channel_send_binary(void *channel, const void *bytes, size_t length) {
    GBytes *data = g_bytes_new(bytes, length);
    g_signal_emit_by_name(channel, "send-data", data);
    g_bytes_unref(data);
}

void parley_channel_close(void *channel) { g_signal_emit_by_name(channel, "close"); }

// MARK: Raw audio taps

typedef struct {
    parley_buffer_callback callback;
    void *context;
} TapListener;

static GstPadProbeReturn on_buffer(GstPad *pad, GstPadProbeInfo *info, gpointer data) {
    TapListener *l = data;
    GstBuffer *buffer = GST_PAD_PROBE_INFO_BUFFER(info);
    GstMapInfo map;
    if (buffer && gst_buffer_map(buffer, &map, GST_MAP_READ)) {
        l->callback(l->context, map.data, map.size);
        gst_buffer_unmap(buffer, &map);
    }
    return GST_PAD_PROBE_OK;
}

unsigned long parley_pad_tap(void *element, const char *pad_name, parley_buffer_callback callback, void *context) {
    GstPad *pad = gst_element_get_static_pad(GST_ELEMENT(element), pad_name);
    if (!pad) return 0;
    TapListener *l = g_new0(TapListener, 1);
    l->callback = callback;
    l->context = context;
    gulong id = gst_pad_add_probe(pad, GST_PAD_PROBE_TYPE_BUFFER, on_buffer, l, g_free);
    gst_object_unref(pad);
    return id;
}

void parley_pad_untap(void *element, const char *pad_name, unsigned long probe) {
    GstPad *pad = gst_element_get_static_pad(GST_ELEMENT(element), pad_name);
    if (!pad) return;
    gst_pad_remove_probe(pad, probe);
    gst_object_unref(pad);
}

char *parley_pad_caps(void *pad) {
    GstCaps *caps = gst_pad_get_current_caps(GST_PAD(pad));
    if (!caps) return NULL;
    char *text = gst_caps_to_string(caps);
    gst_caps_unref(caps);
    return text;
}

int parley_link(void *source, void *destination) {
    return gst_element_link(GST_ELEMENT(source), GST_ELEMENT(destination)) ? 0 : -1;
}

// MARK: appsrc, through its action signals (no link to libgstapp needed)

int parley_appsrc_push(void *appsrc, const void *data, size_t size, uint64_t pts_ns, uint64_t duration_ns) {
    GstBuffer *buffer = gst_buffer_new_memdup(data, size);
    GST_BUFFER_PTS(buffer) = pts_ns;
    GST_BUFFER_DURATION(buffer) = duration_ns;
    GstFlowReturn result = GST_FLOW_ERROR;
    g_signal_emit_by_name(appsrc, "push-buffer", buffer, &result);
    gst_buffer_unref(buffer);
    return result == GST_FLOW_OK ? 0 : -1;
}

void parley_appsrc_end(void *appsrc) {
    GstFlowReturn result;
    g_signal_emit_by_name(appsrc, "end-of-stream", &result);
}

int parley_pipeline_wait_eos(void *pipeline, unsigned int timeout_ms, char **error) {
    GstBus *bus = gst_element_get_bus(GST_ELEMENT(pipeline));
    GstMessage *message = gst_bus_timed_pop_filtered(bus, (GstClockTime)timeout_ms * GST_MSECOND,
                                                     GST_MESSAGE_EOS | GST_MESSAGE_ERROR);
    gst_object_unref(bus);
    if (!message) {
        *error = g_strdup("timed out waiting for the end of the stream");
        return -1;
    }
    int status = 0;
    if (GST_MESSAGE_TYPE(message) == GST_MESSAGE_ERROR) {
        GError *gerror = NULL;
        gst_message_parse_error(message, &gerror, NULL);
        *error = take_message(gerror);
        status = -1;
    }
    gst_message_unref(message);
    return status;
}
