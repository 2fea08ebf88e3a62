// GStreamer's webrtcbin API is marked unstable; Parley pins Debian's 1.22.
#define GST_USE_UNSTABLE_API 1
#include <gst/gst.h>
#include <gst/sdp/sdp.h>
#include <gst/rtp/rtp.h>
#include <gst/webrtc/webrtc.h>
#include <nice/agent.h>
