// Stand-in for Apple's CoreMedia on Linux: only what ParleyApple uses to read a camera format's size,
// transcribed from the iOS SDK headers (checked against the iOS 16.5 SDK in theos/sdks@4af4cb1d), CoreMedia.framework/Headers/CMFormatDescription.h.
// Apple platforms use the real framework. Hooks for tests are marked "Stand-in only".

/// `typedef struct { int32_t width; int32_t height; } CMVideoDimensions;`
public struct CMVideoDimensions: Equatable, Sendable {
    public var width: Int32
    public var height: Int32

    public init(width: Int32, height: Int32) {
        self.width = width
        self.height = height
    }
}

/// `typedef const struct opaqueCMFormatDescription *CMFormatDescriptionRef;` — a class in Swift.
public final class CMFormatDescription: @unchecked Sendable {
    let dimensions: CMVideoDimensions

    /// Stand-in only: descriptions come from the capture device.
    public init(standInWidth width: Int32, height: Int32) {
        dimensions = CMVideoDimensions(width: width, height: height)
    }
}

/// `CM_EXPORT CMVideoDimensions CMVideoFormatDescriptionGetDimensions(CMVideoFormatDescriptionRef videoDesc);`
public func CMVideoFormatDescriptionGetDimensions(_ videoDesc: CMFormatDescription) -> CMVideoDimensions {
    videoDesc.dimensions
}
