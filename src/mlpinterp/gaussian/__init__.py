"""gaussian"""
