# frozen_string_literal: true

require "digest"

class PagesController < ApplicationController
  def json
    render json: { hello: "world", rails: Rails.version, scheme: request.scheme, ssl: request.ssl? }
  end

  # A session and a cookie, then a redirect (Rails 6.1's redirect body hung: its to_ary is nil).
  def login
    session[:user] = params[:name]
    cookies[:seen] = "yes"
    redirect_to "/whoami"
  end

  def whoami
    render plain: "user=#{session[:user]} seen=#{cookies[:seen]}"
  end

  def invalid
    render plain: "not like that", status: :unprocessable_entity
  end

  def upload
    file = params.require(:file)
    data = file.read
    render json: { name: file.original_filename, size: data.bytesize, sha256: Digest::SHA256.hexdigest(data),
                   note: params[:note] }
  end

  def download
    send_file Rails.root.join("public", "big.bin"), filename: "big.bin", type: "application/octet-stream"
  end

  def cached
    fresh_when etag: "v1", public: true
    render plain: "fresh content" unless performed?
  end

  def boom
    raise "boom in an action"
  end

  # Sleeps past the server's request timeout (rails_test: -t 1): Rails' ShowExceptions rescues the
  # Blackbuck::RequestTimeout raised in here, as it rescues every exception.
  def slow
    sleep Float(params[:t] || 30)
    render plain: "slept"
  end
end
