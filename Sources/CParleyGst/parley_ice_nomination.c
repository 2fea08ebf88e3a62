// ICE nomination for webrtcbin's libnice agents.
//
// GStreamer 1.22's webrtcbin makes its libnice agent with NICE_AGENT_OPTION_REGULAR_NOMINATION
// (gst-libs/gst/webrtc/nice/nice.c). Regular nomination (RFC 8445 §8.1.1) has the controlling
// agent check a pair, and once the check succeeded check it again with USE-CANDIDATE: libnice says
// the component is connected, and webrtcbin lets DTLS start, only after that second check, one
// round trip after the first. Aggressive nomination (RFC 5245 §8.1.1.2) sets USE-CANDIDATE on
// every check, so the first check that succeeds nominates its pair: what libwebrtc and aiortc do
// in effect, and one round trip less before DTLS. libnice takes the mode only when the agent is
// made, and webrtcbin gives no way in, so Parley wraps libnice's constructor as it wraps SSL_new
// (parley_dtls_timer.c): the process exports this nice_agent_new_full (the package links it with
// --export-dynamic-symbol=nice_agent_new_full), libgstwebrtcnice binds to it, and it makes the
// agent with libnice's own constructor, without the regular-nomination option unless the process
// asked for regular nomination (parley_ice_set_regular_nomination).

#define _GNU_SOURCE
#include "parley_gst.h"

#include <dlfcn.h>
#include <glib-object.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

typedef struct _NiceAgent NiceAgent;

// From libnice's agent.h (0.1.21): NiceCompatibility, NiceAgentOption and NiceNominationMode are
// plain enums.
enum { NICE_AGENT_OPTION_REGULAR_NOMINATION = 1 << 0 };
enum { NICE_NOMINATION_MODE_AGGRESSIVE = 1 };

static NiceAgent *(*real_agent_new_full)(GMainContext *context, int compatibility, int flags);
static pthread_once_t resolved = PTHREAD_ONCE_INIT;
static atomic_int regular_nomination;
static atomic_ulong agents_made, agents_aggressive;

static void resolve(void) {
    // libnice is loaded by libgstwebrtcnice (a dependency of a plugin, in its own scope): ask it
    // by name; RTLD_NEXT serves where the process itself links it.
    void *libnice = dlopen("libnice.so.10", RTLD_NOW | RTLD_NOLOAD);
    real_agent_new_full = (NiceAgent *(*)(GMainContext *, int, int))dlsym(libnice ? libnice : RTLD_NEXT, "nice_agent_new_full");
    if (!real_agent_new_full) fprintf(stderr, "parley: libnice's nice_agent_new_full was not found: %s\n", dlerror());
}

NiceAgent *nice_agent_new_full(GMainContext *context, int compatibility, int flags) {
    pthread_once(&resolved, resolve);
    if (!real_agent_new_full) return NULL;
    if (!atomic_load(&regular_nomination)) flags &= ~NICE_AGENT_OPTION_REGULAR_NOMINATION;
    NiceAgent *agent = real_agent_new_full(context, compatibility, flags);
    if (agent) {
        atomic_fetch_add(&agents_made, 1);
        // What the agent says it does, not what it was asked.
        int mode = -1;
        g_object_get(agent, "nomination-mode", &mode, NULL);
        if (mode == NICE_NOMINATION_MODE_AGGRESSIVE) atomic_fetch_add(&agents_aggressive, 1);
    }
    return agent;
}

void parley_ice_set_regular_nomination(int regular) { atomic_store(&regular_nomination, regular != 0); }

int parley_ice_regular_nomination(void) { return atomic_load(&regular_nomination); }

unsigned long parley_ice_agents_made(void) { return atomic_load(&agents_made); }

unsigned long parley_ice_agents_nominating_aggressively(void) { return atomic_load(&agents_aggressive); }
