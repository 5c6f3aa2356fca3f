//! What the socket wrappers share: each times or watches reads, and passes writes through.

/// Writes go straight to the socket of a wrapper that only watches reads.
macro_rules! forward_writes {
    ($wrapper:ty) => {
        impl AsyncWrite for $wrapper {
            fn poll_write(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.stream).poll_write(cx, buf)
            }

            fn poll_write_vectored(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.stream.is_write_vectored()
            }

            fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                Pin::new(&mut self.stream).poll_flush(cx)
            }

            fn poll_shutdown(
                mut self: Pin<&mut Self>,
                cx: &mut Context<'_>,
            ) -> Poll<io::Result<()>> {
                Pin::new(&mut self.stream).poll_shutdown(cx)
            }
        }
    };
}

pub(super) use forward_writes;
