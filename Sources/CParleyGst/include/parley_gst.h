// The C edge between Parley's Swift media engine and GStreamer's webrtcbin.
//
// Swift cannot call variadic C functions (g_signal_emit_by_name, g_object_set) or macros, and
// GObject casts are noisy from Swift. This layer wraps exactly what the engine uses and hands
// GStreamer objects to Swift as opaque pointers. Every callback into Swift goes through one
// function pointer per object kind, on whatever GStreamer thread raised it.
#ifndef PARLEY_GST_H
#define PARLEY_GST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// gst_init; returns 0 on success.
int parley_gst_init(void);
/// The names of the elements in `names` (space separated) that are not installed, or NULL when
/// all are. Free with parley_free.
char *parley_gst_missing_elements(const char *names);
/// Generates the process's default DTLS certificate now, so the first call does not wait for it.
void parley_gst_warm_dtls(void);
/// The process's DTLS certificate and key (ECDSA P-256), PEM, as dtlsdec's "pem" takes them; made
/// on first use and kept. NULL if OpenSSL could not make them (webrtcbin then uses its own, RSA).
const char *parley_dtls_certificate_pem(void);
/// Its fingerprint as an SDP "a=fingerprint:" value ("sha-256 AB:CD:…"), NULL with no certificate.
const char *parley_dtls_certificate_fingerprint(void);
/// How many DTLS handshakes (OpenSSL SSL objects) got Parley's shorter retransmission timer
/// (parley_dtls_timer.c); and the timer that follows `timer_us` (0: the first).
unsigned long parley_dtls_timers_set(void);
unsigned int parley_dtls_next_timer_us(unsigned int timer_us);
/// ICE nomination of the libnice agents webrtcbin makes from now on (parley_ice_nomination.c):
/// aggressive (0, the default) or regular (1, as webrtcbin asks). How many agents this process
/// made through Parley's wrapper, and how many of them nominate aggressively.
void parley_ice_set_regular_nomination(int regular);
int parley_ice_regular_nomination(void);
unsigned long parley_ice_agents_made(void);
unsigned long parley_ice_agents_nominating_aggressively(void);
/// Frees GStreamer's global state; only when nothing of GStreamer is alive any more (the leaks
/// tracer reports what is still alive at this point).
void parley_gst_deinit(void);
void parley_free(void *pointer);

// MARK: Pipelines

/// A pipeline from a gst-launch description. On failure returns NULL and sets *error.
void *parley_pipeline_new(const char *description, char **error);
/// A bin from a description, with ghost pads for its unlinked pads.
void *parley_bin_new(const char *description, char **error);
/// Asks for RFC 6464 audio levels as header extension `id` in the caps of the capsfilter named
/// `capsfilter` in `bin`: the payloader before it then writes them (from GstAudioLevelMeta).
int parley_capsfilter_add_audio_level(void *bin, const char *capsfilter, unsigned id);
/// 0 on success.
int parley_element_set_state_playing(void *element);
/// webrtcbin accepts data channels from READY on.
int parley_element_set_state_ready(void *element);
/// Sets the state to NULL and waits for it.
void parley_element_stop(void *element);
void parley_object_unref(void *object);
/// The child named `name` (a new reference) or NULL.
void *parley_bin_get(void *bin, const char *name);
/// Adds `child` to `bin`, syncs its state with the parent, and links `pad` to its sink pad.
int parley_bin_add_and_link(void *bin, void *child, void *pad);

/// Adds `child` to `bin`, links its src pad to `destination` (requesting a pad there), and syncs its state.
int parley_bin_add_and_link_to(void *bin, void *child, void *destination);
/// Holds (`hold` 1) or releases (0) the source elements of `bin`: a held source stays in NULL
/// whatever its bin's state (a device is not opened, nothing is produced); a released one takes
/// its bin's state.
void parley_bin_hold_sources(void *bin, int hold);
/// Links two elements, requesting pads where needed (a mixer's sink_%u). 0 on success.
int parley_link(void *source, void *destination);

void parley_set_bool(void *object, const char *property, int value);
void parley_set_int(void *object, const char *property, int value);
void parley_set_uint(void *object, const char *property, unsigned int value);
void parley_set_double(void *object, const char *property, double value);
void parley_set_string(void *object, const char *property, const char *value);
/// Sets an enum or flags property from its nick ("max-bundle", "relay").
void parley_set_from_string(void *object, const char *property, const char *value);
int parley_get_enum(void *object, const char *property);

// MARK: webrtcbin

enum parley_event_kind {
    PARLEY_EVENT_NEGOTIATION_NEEDED = 1,
    /// number = m-line index, text = candidate
    PARLEY_EVENT_ICE_CANDIDATE = 2,
    /// number = GstWebRTCICEConnectionState
    PARLEY_EVENT_ICE_CONNECTION_STATE = 3,
    /// number = GstWebRTCICEGatheringState
    PARLEY_EVENT_ICE_GATHERING_STATE = 4,
    /// object = the new src pad (borrowed), text = its media ("audio", "video")
    PARLEY_EVENT_PAD_ADDED = 5,
    /// object = a GstWebRTCDataChannel (borrowed) the remote side opened
    PARLEY_EVENT_DATA_CHANNEL = 6,
    /// text = the message; from the pipeline's bus
    PARLEY_EVENT_ERROR = 7,
    PARLEY_EVENT_WARNING = 8,
    /// number = GstWebRTCPeerConnectionState: ICE and DTLS together
    PARLEY_EVENT_CONNECTION_STATE = 9,
};

typedef void (*parley_event_callback)(void *context, int kind, unsigned int number, const char *text, void *object);

/// Connects webrtcbin's signals and the pipeline's bus to `callback`. Detach before the context goes.
void parley_webrtc_attach(void *pipeline, void *webrtc, parley_event_callback callback, void *context);
void parley_webrtc_detach(void *pipeline, void *webrtc, void *context);

/// A promise was answered, exactly once: `replied` is 0 when webrtcbin dropped or interrupted it
/// (a closing element does); `reply` is the reply structure, NULL for none, valid during the call.
typedef void (*parley_promise_callback)(void *context, int replied, void *reply);

void parley_webrtc_create_offer(void *webrtc, parley_promise_callback callback, void *context);
void parley_webrtc_create_answer(void *webrtc, parley_promise_callback callback, void *context);
/// The SDP text of an offer or answer reply, or NULL with *error set. Free with parley_free.
char *parley_reply_sdp(void *reply, char **error);
/// The error message a reply carries, or NULL (also for no reply, which is how set-description succeeds).
char *parley_reply_error(void *reply);
/// type: "offer", "answer", "pranswer", "rollback". Returns 0, or -1 with *error set when the SDP does not parse.
int parley_webrtc_set_description(void *webrtc, int local, const char *type, const char *sdp,
                                  parley_promise_callback callback, void *context, char **error);
void parley_webrtc_add_ice_candidate(void *webrtc, unsigned int mline, const char *candidate);
/// 1 when the TURN URI was accepted.
int parley_webrtc_add_turn_server(void *webrtc, const char *uri);
void parley_webrtc_get_stats(void *webrtc, parley_promise_callback callback, void *context);

/// The figures Parley reads from a get-stats reply, normalised across 1.22's quirks.
typedef struct {
    double round_trip_time_ms;   // < 0 when unknown
    double jitter_ms;            // < 0 when unknown
    uint64_t packets_received;
    int64_t packets_lost;
    uint64_t bytes_sent;
    uint64_t bytes_received;
    uint64_t packets_sent;
    double remote_fraction_lost;  // 0…1 from the far end's last receiver report; < 0 when none yet
} parley_stats;

void parley_stats_read(void *reply, parley_stats *out);

// MARK: Receive jitter buffers (rtpjitterbuffer inside webrtcbin's rtpbin)
// webrtcbin makes them with do-lost on: a lost packet becomes a gap event that the Opus decoder
// rebuilds from in-band FEC or conceals.

/// What the jitter buffers did so far, summed over every received stream.
typedef struct {
    uint64_t pushed;
    uint64_t lost;
    uint64_t late;
    double jitter_ms;  // the largest stream's running interarrival jitter; < 0 when none yet
    unsigned int latency_ms;
    uint64_t retransmissions_asked;     // NACKed packets
    uint64_t retransmissions_received;  // of those, how many came back in time
    double retransmission_rtt_ms;       // how long a retransmission took to come; 0 before one did
    uint64_t gap_packets;               // sequence numbers missing from what the buffers let out
    uint64_t gap_runs;                  // in how many runs of consecutive ones (from their first read on)
} parley_jitter_stats;

/// Until `webrtc` is connected (ICE and DTLS): drops what the send chain `bin` lets out at its
/// last element `end`, and holds a played file at `file` (NULL when none) so that it starts at the
/// connection. webrtcbin holds its transport back until DTLS is up, and what a send chain made
/// meanwhile (audio and the RTCP sender reports timed by it) used to queue up and go out in a burst
/// at the connection: seconds of stale audio, and sender reports whose round trips read seconds
/// long. 0 when an element is not in `bin`.
int parley_send_from_connection(void *webrtc, void *bin, const char *end, const char *file);

/// Makes the lost-packet events reaching an Opus depayloader (`depay`, its sink pad) say how much
/// audio was lost in whole packets: the jitter buffer estimates a gap's duration from when packets
/// arrived, which jitter skews, and the Opus decoder rebuilds a packet from the next one's in-band
/// FEC only when asked for at least that packet's duration (libopus falls back to concealment
/// otherwise), and conceals exactly as much as it is asked for. 0 when `depay` has no sink pad.
int parley_opus_depay_exact_gaps(void *depay);

/// 0 when there is no jitter buffer yet.
int parley_jitter_buffers_read(void *webrtc, parley_jitter_stats *out);
/// Sets every jitter buffer's latency, and webrtcbin's for those made later.
void parley_jitter_buffers_set_latency(void *webrtc, unsigned int latency_ms);
/// Negotiates NACK and RTX on every transceiver and asks for lost packets again; call before
/// the first description.
void parley_webrtc_enable_retransmission(void *webrtc);
/// How many packets we sent the far side asked for again (NACK), over every stream so far.
uint64_t parley_retransmissions_asked(void *webrtc);
/// Sets the shortest RTCP report interval of every RTP session (GStreamer's default is RFC 3550's
/// 5 s); answers how many sessions there were.
int parley_rtp_sessions_set_rtcp_interval(void *webrtc, unsigned int interval_ms);

// MARK: ICE agent (libnice)

/// Restricts gathering to the given local addresses (loopback included when named) and turns UPnP off.
int parley_ice_add_local_address(void *webrtc, const char *address);
/// UPnP off, connectivity checks paced every `pacing_ms` (RFC 8445's Ta; libnice's default is 20 ms),
/// and host TCP candidates (RFC 6544) gathered only when `tcp` is non-zero.
void parley_ice_configure(void *webrtc, unsigned int pacing_ms, int tcp);
/// Restarts ICE on every stream: new checks; the selected pair keeps carrying media meanwhile.
void parley_ice_restart(void *webrtc);
/// The pair ICE selected: candidate types ("host", "srflx", "prflx", "relay"; buffers of 16) and the
/// local address (a buffer of at least 46, NICE_ADDRESS_STRING_LEN) and port. 0 when there is one.
int parley_ice_selected_pair(void *webrtc, char *local_type, char *remote_type, char *local_address, int *local_port,
                             char *remote_address, int *remote_port);

// MARK: Data channels

enum parley_channel_event_kind {
    PARLEY_CHANNEL_OPEN = 1,
    PARLEY_CHANNEL_TEXT = 2,
    PARLEY_CHANNEL_BINARY = 3,
    PARLEY_CHANNEL_CLOSED = 4,
    PARLEY_CHANNEL_ERROR = 5,
};

typedef void (*parley_channel_callback)(void *context, int kind, const void *bytes, size_t length);

/// max_retransmits < 0 means reliable. Returns a new reference or NULL.
void *parley_webrtc_create_data_channel(void *webrtc, const char *label, int ordered, int max_retransmits);
void parley_channel_attach(void *channel, parley_channel_callback callback, void *context);
void parley_channel_detach(void *channel, void *context);
/// The label (free with parley_free) and whether it is ordered.
char *parley_channel_label(void *channel);
int parley_channel_ordered(void *channel);
int parley_channel_ready_state(void *channel);
void parley_channel_send_text(void *channel, const char *text);
void parley_channel_send_binary(void *channel, const void *bytes, size_t length);
void parley_channel_close(void *channel);
void *parley_object_ref(void *object);

// MARK: Raw audio taps

/// Called for every buffer that passes `pad`, with its mapped bytes.
typedef void (*parley_buffer_callback)(void *context, const void *bytes, size_t length);
/// Returns the probe id.
unsigned long parley_pad_tap(void *element, const char *pad_name, parley_buffer_callback callback, void *context);
void parley_pad_untap(void *element, const char *pad_name, unsigned long probe);
/// The pad's current caps as text (free with parley_free), or NULL.
char *parley_pad_caps(void *pad);

/// Pushes a copy of `size` bytes into an appsrc as one buffer; 0 when it took it.
int parley_appsrc_push(void *appsrc, const void *data, size_t size, uint64_t pts_ns, uint64_t duration_ns);
/// Ends an appsrc's stream.
void parley_appsrc_end(void *appsrc);
/// Waits for a pipeline's end of stream (0) or error (-1, with a message to free), at most `timeout_ms`.
int parley_pipeline_wait_eos(void *pipeline, unsigned int timeout_ms, char **error);

#ifdef __cplusplus
}
#endif


#endif
