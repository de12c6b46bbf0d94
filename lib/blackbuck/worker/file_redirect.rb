# frozen_string_literal: true

module Blackbuck
  # X-Sendfile and X-Accel-Redirect: the app (Rack::Sendfile, Rails' send_file behind it) names a
  # file in a response header and the server sends that file as the body. Acted on only when
  # configured (x_sendfile, x_accel_mapping), since the path comes from the app: the operator
  # decides how far to trust it (docs/SECURITY.md). Otherwise the headers pass through untouched,
  # for nginx in front to act on. #resolve says what to do with one response's headers.
  class FileRedirect
    # Send the file at path (absolute) as a 200 response with these headers: the app's, minus the
    # redirect header and the fields that described the app's own body. via names the header.
    Target = Struct.new(:path, :headers, :via)
    # Refuse the response (500): reason is the log line.
    Refused = Struct.new(:reason)

    X_SENDFILE = "X-Sendfile"
    X_ACCEL = "X-Accel-Redirect"
    # Fields that describe the app's placeholder body (Rack::Sendfile sets content-length: 0), not the file.
    BODY_FIELDS = %w[content-length transfer-encoding content-range].freeze

    # nil when neither setting is on: no header is looked at.
    def self.for(config)
      return nil unless config[:x_sendfile] || !config[:x_accel_mapping].empty?

      new(x_sendfile: config[:x_sendfile], mapping: config[:x_accel_mapping])
    end

    # Errors that mean "no such file for you" (404, as nginx answers); any other (EMFILE, EIO...)
    # is the server's trouble (500).
    NOT_FOUND_ERRORS = [Errno::ENOENT, Errno::ENOTDIR, Errno::ENAMETOOLONG, Errno::ELOOP, Errno::EACCES].freeze

    # Why the file at path could not be sent: [status, reason for the log line].
    def self.unusable(path)
      File.open(path, File::RDONLY | File::NONBLOCK) do |f|
        f.stat.file? ? [500, "changed while it was opened"] : [404, "not a regular file"]
      end
    rescue *NOT_FOUND_ERRORS => e
      [404, e.message.sub(/ @ .*/, "")]
    rescue SystemCallError => e
      [500, e.message.sub(/ @ .*/, "")]
    end

    # mapping: [[uri_prefix, directory], ...] as Config validated them (prefix ends in "/").
    def initialize(x_sendfile:, mapping:)
      @x_sendfile = x_sendfile
      @mapping = mapping.sort_by { |prefix, _| -prefix.bytesize } # the longest prefix wins
    end

    # nil (the response is the app's) | Target | Refused. X-Sendfile wins when both are there;
    # every header acted on is removed either way.
    def resolve(headers)
      sendfile = accel = nil
      headers.each_key do |k|
        next unless k.is_a?(String)

        if @x_sendfile && k.casecmp?(X_SENDFILE) then sendfile = k
        elsif !@mapping.empty? && k.casecmp?(X_ACCEL) then accel = k
        end
      end
      return nil unless sendfile || accel

      key, via = sendfile ? [sendfile, X_SENDFILE] : [accel, X_ACCEL]
      value = headers[key]
      value = value.first if value.is_a?(Array) && value.size == 1
      return Refused.new("#{via} must be one String, got #{value.inspect[0, 200]}: refused") unless value.is_a?(String)

      path = via == X_SENDFILE ? sendfile_path(value) : accel_path(value)
      return path if path.is_a?(Refused)

      rest = headers.reject do |k, _|
        k.equal?(sendfile) || k.equal?(accel) || (k.is_a?(String) && BODY_FIELDS.include?(k.downcase))
      end
      Target.new(path, rest, via)
    end

    private

    # X-Sendfile: an absolute path, taken as it is (the app is trusted with the whole filesystem).
    def sendfile_path(value)
      return refused(X_SENDFILE, "is not an absolute path", value) unless value.start_with?("/")
      return refused(X_SENDFILE, "contains NUL", value) if value.include?("\0")

      value
    end

    # X-Accel-Redirect: a URI path (its query ignored), percent-decoded, under one of the mapped
    # prefixes; the rest of it is looked up in that prefix's directory. A "." or ".." segment
    # (after decoding, so %2e%2e too), NUL, or a malformed %-escape is refused: it cannot escape
    # the directory. Symbolic links inside the directory are followed, as nginx does by default.
    def accel_path(value)
      uri = value.b.split("?", 2).first.to_s
      return refused(X_ACCEL, "is not a path", value) unless uri.start_with?("/")
      return refused(X_ACCEL, "has a malformed %-escape", value) if uri.match?(/%(?!\h\h)/)

      decoded = uri.gsub(/%(\h\h)/) { Regexp.last_match(1).hex.chr }
      return refused(X_ACCEL, "contains NUL", value) if decoded.include?("\0")
      return refused(X_ACCEL, "has a . or .. segment", value) if decoded.split("/").any? { |s| [".", ".."].include?(s) }

      prefix, dir = @mapping.find { |p, _| decoded.start_with?(p.b) }
      return refused(X_ACCEL, "is outside every x_accel_mapping", value) unless prefix

      File.join(dir.b, decoded.byteslice(prefix.bytesize..))
    end

    def refused(via, why, value) = Refused.new("#{via} #{value.inspect[0, 200]} #{why}: refused")
  end
end
