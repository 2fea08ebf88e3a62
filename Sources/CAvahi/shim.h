// Avahi's client library (Debian's libavahi-client-dev): DNS-SD over multicast DNS through the
// system's avahi-daemon, for LAN calls (Sources/ParleyAvahi).
#include <avahi-client/client.h>
#include <avahi-client/lookup.h>
#include <avahi-client/publish.h>
#include <avahi-common/address.h>
#include <avahi-common/alternative.h>
#include <avahi-common/error.h>
#include <avahi-common/malloc.h>
#include <avahi-common/strlst.h>
#include <avahi-common/thread-watch.h>
